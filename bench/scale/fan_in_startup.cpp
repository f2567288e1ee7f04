#include "fan_in_startup.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <asio.hpp>
#include <fmt/format.h>

#include "bench_util.h"
#include "sim.h"
#include "startup.h"
#include "store/server_impl.h"

namespace tide::bench::scale {

namespace {

// "key=value" fields of a line, by key.
std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  for (std::string word; in >> word;) {
    if (auto eq = word.find('='); eq != std::string::npos) {
      out[word.substr(0, eq)] = word.substr(eq + 1);
    }
  }
  return out;
}

// Where node i's fan-in listens: an address of its own, 127.8.x.y (as each
// node is its own host), so that tens of thousands of listeners, and the
// TIME_WAIT their connections leave behind, never exhaust one address's
// ports.
uint32_t node_address(size_t node) {
  auto b = static_cast<uint32_t>(8 + node / (256 * 254));
  auto c = static_cast<uint32_t>((node / 254) % 256);
  auto d = static_cast<uint32_t>(node % 254 + 1);
  return (127u << 24) | (b << 16) | (c << 8) | d;
}

std::string dotted(uint32_t a) {
  return fmt::format(
      "{}.{}.{}.{}", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
}

}  // namespace

FanInResult run_fan_in_startup(const FanInConfig& cfg, ServerProcess& root) {
  const size_t hosts =
      (cfg.nodes + cfg.nodes_per_host - 1) / cfg.nodes_per_host;
  const size_t total = cfg.nodes * cfg.ranks_per_node;
  std::vector<std::unique_ptr<Child>> children;
  std::vector<std::unique_ptr<LineReader>> lines;
  FanInResult r;
  for (size_t h = 0; h < hosts; ++h) {
    size_t first = cfg.nodes * h / hosts;
    size_t last = cfg.nodes * (h + 1) / hosts;
    children.push_back(std::make_unique<Child>(
        std::vector<std::string>{
            cfg.self,
            "node-host",
            "--root-port",
            std::to_string(root.port()),
            "--first-node",
            std::to_string(first),
            "--nodes",
            std::to_string(last - first),
            "--ranks",
            std::to_string(cfg.ranks_per_node),
            "--total",
            std::to_string(total),
            "--dialect",
            cfg.dialect == store::Dialect::kModern ? "modern" : "legacy",
            "--timeout-ns",
            std::to_string(cfg.timeout_ns),
            "--per-address",
            std::to_string(cfg.per_address),
            "--connect-window",
            std::to_string(cfg.connect_window)},
        ChildOptions{.pipes = true, .name = fmt::format("node host {}", h)}));
    lines.push_back(std::make_unique<LineReader>(children.back()->out()));
  }
  try {
    int64_t ready_by = mono_ns() + 120'000'000'000;
    for (auto& l : lines) {
      auto line = l->next(ready_by, "a node host's fan-ins");
      if (!line || *line != "READY") {
        throw std::runtime_error(
            "a node host did not start: " + line.value_or("(exited)"));
      }
    }
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  r.root_rss_before_kb = root.rss_kb();
  double root_cpu = root.cpu_seconds();
  double hosts_cpu = 0;
  for (auto& c : children) {
    hosts_cpu -= cpu_seconds_of(c->pid());
  }
  int64_t start = mono_ns();
  for (auto& c : children) {
    if (::write(c->in(), "GO\n", 3) != 3) {
      r.error = "a node host is gone";
      return r;
    }
  }
  int64_t connected = 0;
  int64_t barrier = 0;
  try {
    int64_t done_by = start + cfg.timeout_ns + 30'000'000'000;
    for (auto& l : lines) {
      auto line = l->next(done_by, "a node host's ranks");
      if (!line || line->rfind("DONE", 0) != 0) {
        throw std::runtime_error(
            "a node host failed: " + line.value_or("(exited)"));
      }
      auto f = fields(*line);
      r.done += std::stoull(f["done"]);
      connected = std::max<int64_t>(connected, std::stoll(f["connected_ns"]));
      barrier = std::max<int64_t>(barrier, std::stoll(f["barrier_ns"]));
      r.requests += std::stoull(f["requests"]);
      r.frames += std::stoull(f["frames"]);
      if (auto e = line->find("error=");
          e != std::string::npos && e + 6 < line->size() && r.error.empty()) {
        r.error = line->substr(e + 6);
      }
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  // Every rank connected (and through, or stuck): what the store holds.
  r.root_rss_after_kb = root.rss_kb();
  r.root_fds = root.open_fds();
  r.root_cpu_s = root.cpu_seconds() - root_cpu;
  for (auto& c : children) {
    hosts_cpu += cpu_seconds_of(c->pid());
  }
  r.hosts_cpu_s = hosts_cpu;
  for (auto& c : children) {
    c->close_in();
  }
  for (auto& c : children) {
    c->wait_until(mono_ns() + 30'000'000'000);
  }
  r.ok = r.done == total && r.error.empty();
  auto since = [&](int64_t t) {
    return t > 0 ? static_cast<double>(t - start) / 1e9 : NAN;
  };
  r.connect_s = since(connected);
  r.barrier_s = since(barrier);
  return r;
}

int node_host_main(int argc, char** argv) {
  CLI::App app("scale_bench node-host: one host's simulated nodes");
  uint16_t root_port = 0;
  size_t first = 0;
  size_t nodes = 0;
  size_t ranks = 8;
  size_t total = 0;
  std::string dialect = "modern";
  int64_t timeout_ns = 60'000'000'000;
  size_t per_address = 1000;
  size_t connect_window = 1024;
  app.add_option("--root-port", root_port)->required();
  app.add_option("--first-node", first)->required();
  app.add_option("--nodes", nodes)->required();
  app.add_option("--ranks", ranks);
  app.add_option("--total", total)->required();
  app.add_option("--dialect", dialect);
  app.add_option("--timeout-ns", timeout_ns);
  app.add_option("--per-address", per_address);
  app.add_option("--connect-window", connect_window);
  CLI11_PARSE(app, argc, argv);

  // A fan-in: its listener, its upstream connection, its ranks' connections;
  // and the ranks' own ends.
  sim::raise_fd_limit(nodes * (2 * ranks + 2) + sim::kSpareFds);
  asio::io_context io;
  std::vector<std::unique_ptr<store::TcpStoreServer>> fan_ins;
  fan_ins.reserve(nodes);
  for (size_t i = 0; i < nodes; ++i) {
    fan_ins.push_back(store::detail::start_server_on(
        io,
        {.host = dotted(node_address(first + i)),
         .port = 0,
         .upstream = store::StoreUpstream{
             .port = root_port, .connect_timeout = std::chrono::seconds(60)}}));
  }
  auto work = asio::make_work_guard(io);
  std::thread loop_thread([&io] { io.run(); });
  std::printf("READY\n");
  std::fflush(stdout);
  std::string go;
  if (!std::getline(std::cin, go)) {
    std::_Exit(0);
  }

  StartupConfig cfg{
      .clients = total,
      .dialect = dialect == "legacy" ? store::Dialect::kLegacy
                                     : store::Dialect::kModern,
      .timeout_ns = timeout_ns};
  sim::Loop loop;
  loop.set_connect_window(connect_window);
  std::vector<StartupClient> clients(nodes * ranks);
  size_t done = 0;
  std::string error;
  for (size_t i = 0; i < nodes; ++i) {
    for (size_t k = 0; k < ranks; ++k) {
      size_t rank = (first + i) * ranks + k;
      StartupClient& c = clients[i * ranks + k];
      c.conn = std::make_unique<sim::Conn>(
          loop,
          sim::ConnOptions{
              .host = node_address(first + i),
              .port = fan_ins[i]->port(),
              .source = sim::source_address(rank, per_address),
              .dialect = cfg.dialect,
              .connect_timeout_ns = timeout_ns});
      loop.spawn(start_up(c, rank, total, cfg), [&](std::exception_ptr e) {
        if (!e) {
          ++done;
          return;
        }
        if (error.empty()) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            error = x.what();
          }
        }
      });
    }
  }
  if (!loop.run(mono_ns() + timeout_ns) && error.empty()) {
    error = "not complete in time";
  }
  int64_t connected = 0;
  int64_t barrier = 0;
  uint64_t requests = 0;
  for (const auto& c : clients) {
    connected = std::max(connected, c.connected_at);
    barrier = std::max(barrier, c.barrier_at);
    requests += c.conn->stats().requests;
  }
  uint64_t frames = 0;
  for (const auto& f : fan_ins) {
    frames += f->fan_in_counts().frames;
  }
  std::replace(error.begin(), error.end(), '\n', ' ');
  std::printf(
      "DONE done=%zu connected_ns=%lld barrier_ns=%lld requests=%llu "
      "frames=%llu error=%s\n",
      done,
      static_cast<long long>(connected),
      static_cast<long long>(barrier),
      static_cast<unsigned long long>(requests),
      static_cast<unsigned long long>(frames),
      error.c_str());
  std::fflush(stdout);
  // Connections stay open until the bench has measured the store.
  while (std::getline(std::cin, go)) {
  }
  // The kernel closes tens of thousands of sockets faster than their
  // destructors would.
  std::_Exit(0);
}

}  // namespace tide::bench::scale
