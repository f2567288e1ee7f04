// scale_bench: the control plane at the scale of large jobs, on one machine.
//
//   startup     N store clients run init_process_group's start-up against a
//               store server in its own process: connect, publish an address,
//               count in, wait for the last one; with --fetch-all each then
//               reads every peer's address with batched multi_get (gloo's full
//               mesh). tide-store against torch 1.13's TCPStore server, each
//               cell on a fresh server, bounded by --timeout.
//   rendezvous  N simulated agents run tide's c10d rendezvous against
//               tide-store: one round from cold, then (--kill) one agent is
//               killed and the survivors re-form the job; the keep-alive
//               traffic of the idle job in between.
//
// The clients are coroutines on a few epoll threads (bench/scale/sim.h), not
// a thread each, spread over 127.x source addresses so that no address runs
// out of ephemeral ports; the bench raises its descriptor limit (children
// inherit it). Results: a markdown table of medians and RESULT lines; the
// figures and the command go in docs/benchmarks.md.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_util.h"
#include "fan_in_startup.h"
#include "rendezvous_sim.h"
#include "server_process.h"
#include "sim.h"
#include "startup.h"
#include "status_sim.h"

namespace tide::bench::scale {
namespace {

std::unique_ptr<ServerProcess> start_server(
    const std::string& name,
    const std::string& tide_store,
    const std::string& python,
    const std::string& torch_peer) {
  if (name == "tide") {
    return std::make_unique<ServerProcess>(
        "tide-store",
        std::vector<std::string>{
            tide_store, "--host", "127.0.0.1", "--port", "0"},
        sim::kServerStartTimeout);
  }
  if (name == "torch") {
    return std::make_unique<ServerProcess>(
        "torch TCPStore",
        std::vector<std::string>{
            python,
            torch_peer,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--timeout",
            "3600"},
        sim::kServerStartTimeout);
  }
  throw std::invalid_argument(
      "unknown server \"" + name + "\" (tide or torch)");
}

// ---------------------------------------------------------------------------
// fan-in: the start-up barrier through node-level fan-ins, beside the direct
// design where this machine's descriptors allow it.

struct FanInOptions {
  std::string nodes = "1024,4096,12288";
  size_t ranks_per_node = 8;
  size_t nodes_per_host = 1024;
  int reps = 3;
  double timeout_s = 60;
  std::string tide_store = TIDE_BENCH_TIDE_STORE;
  std::string dialect = "modern";
};

int run_fan_in_bench(const FanInOptions& o) {
  auto counts = parse_counts(o.nodes);
  size_t most = 0;
  for (size_t n : counts) {
    most = std::max(most, n * o.ranks_per_node);
  }
  const uint64_t fds = sim::raise_fd_limit(most + sim::kSpareFds);
  struct Cell {
    std::vector<double> fan_in_s, direct_s, root_cpu_s, hosts_cpu_s;
    std::vector<double> root_fds, root_rss_kb, frames_per_rank;
    std::vector<std::string> failures;
    std::string direct_note;
  };
  std::map<size_t, Cell> cells;
  auto tide = [&] { return start_server("tide", o.tide_store, "", ""); };
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t nodes : counts) {
      Cell& cell = cells[nodes];
      size_t ranks = nodes * o.ranks_per_node;
      std::fprintf(
          stderr,
          "scale_bench: fan-in, %zu nodes x %zu ranks (rep %d)\n",
          nodes,
          o.ranks_per_node,
          rep + 1);
      auto root = tide();
      FanInResult r = run_fan_in_startup(
          {.nodes = nodes,
           .ranks_per_node = o.ranks_per_node,
           .nodes_per_host = o.nodes_per_host,
           .dialect = o.dialect == "legacy" ? store::Dialect::kLegacy
                                            : store::Dialect::kModern,
           .timeout_ns = static_cast<int64_t>(o.timeout_s * 1e9),
           .self = std::filesystem::read_symlink("/proc/self/exe")},
          *root);
      root->stop();
      std::printf(
          "RESULT fan_in nodes=%zu ranks=%zu ok=%d done=%zu connect_s=%.3f "
          "barrier_s=%.3f root_cpu_s=%.2f hosts_cpu_s=%.2f root_fds=%zu "
          "root_rss_kb=%llu->%llu requests=%llu frames=%llu error=\"%s\"\n",
          nodes,
          ranks,
          r.ok ? 1 : 0,
          r.done,
          r.connect_s,
          r.barrier_s,
          r.root_cpu_s,
          r.hosts_cpu_s,
          r.root_fds,
          static_cast<unsigned long long>(r.root_rss_before_kb),
          static_cast<unsigned long long>(r.root_rss_after_kb),
          static_cast<unsigned long long>(r.requests),
          static_cast<unsigned long long>(r.frames),
          r.error.c_str());
      std::fflush(stdout);
      if (!r.ok) {
        cell.failures.push_back(
            fmt::format("{} of {} through: {}", r.done, ranks, r.error));
      } else {
        cell.fan_in_s.push_back(r.barrier_s);
        cell.root_cpu_s.push_back(r.root_cpu_s);
        cell.hosts_cpu_s.push_back(r.hosts_cpu_s);
        cell.root_fds.push_back(static_cast<double>(r.root_fds));
        cell.root_rss_kb.push_back(static_cast<double>(
            r.root_rss_after_kb -
            std::min(r.root_rss_after_kb, r.root_rss_before_kb)));
        cell.frames_per_rank.push_back(
            static_cast<double>(r.frames) / static_cast<double>(ranks));
      }
      // The direct design: every rank a connection of the store.
      if (ranks + sim::kSpareFds > fds) {
        cell.direct_note = sim::fd_limit_note(ranks + sim::kSpareFds, fds);
        continue;
      }
      auto direct_root = tide();
      StartupResult d = run_startup(
          {.clients = ranks,
           .timeout_ns = static_cast<int64_t>(o.timeout_s * 1e9)},
          *direct_root);
      direct_root->stop();
      std::printf(
          "RESULT fan_in_direct ranks=%zu ok=%d barrier_s=%.3f "
          "server_cpu_s=%.2f error=\"%s\"\n",
          ranks,
          d.ok ? 1 : 0,
          d.barrier_s,
          d.server_cpu_s,
          d.error.c_str());
      if (d.ok) {
        cell.direct_s.push_back(d.barrier_s);
      } else {
        cell.direct_note = "failed: " + d.error;
      }
    }
  }
  std::printf(
      "\n## Start-up barrier through node fan-ins (%s, %s, %d reps, bound "
      "%.0f s)\n\n",
      now_utc().c_str(),
      kernel().c_str(),
      o.reps,
      o.timeout_s);
  std::printf(
      "| nodes x ranks | ranks | through fan-ins | store connections | store "
      "RSS growth | store CPU | nodes' CPU (fan-ins + ranks) | frames upstream "
      "per rank | direct (a connection per rank) |\n"
      "|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  bool ok = true;
  for (size_t nodes : counts) {
    Cell& c = cells[nodes];
    size_t ranks = nodes * o.ranks_per_node;
    auto dur = [](const std::vector<double>& v) {
      return v.empty() ? std::string() : format_duration(median(v), 0);
    };
    std::string fan_in =
        c.fan_in_s.empty()
            ? "failed: " + (c.failures.empty() ? "" : c.failures.front())
            : fmt::format(
                  "{} ({} - {})",
                  format_duration(median(c.fan_in_s), 1),
                  format_duration(stats(c.fan_in_s).min, 1),
                  format_duration(stats(c.fan_in_s).max, 1));
    std::string direct = c.direct_s.empty()
                             ? c.direct_note
                             : format_duration(median(c.direct_s), 1);
    std::printf(
        "| %zu x %zu | %zu | %s | %s | %s | %s | %s | %s | %s |\n",
        nodes,
        o.ranks_per_node,
        ranks,
        fan_in.c_str(),
        c.root_fds.empty() ? ""
                           : fmt::format("{:.0f}", median(c.root_fds)).c_str(),
        c.root_rss_kb.empty()
            ? ""
            : fmt::format("{:.1f} MiB", median(c.root_rss_kb) / 1024).c_str(),
        dur(c.root_cpu_s).c_str(),
        dur(c.hosts_cpu_s).c_str(),
        c.frames_per_rank.empty()
            ? ""
            : fmt::format("{:.2f}", median(c.frames_per_rank)).c_str(),
        direct.c_str());
    ok = ok && static_cast<int>(c.fan_in_s.size()) == o.reps;
  }
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// startup

struct StartupOptions {
  std::string clients = "10000,32000,96000";
  std::string fetch_clients = "2048,4096,8192";
  std::string servers = "tide,torch";
  int reps = 3;
  double timeout_s = 60;
  size_t threads = 1;
  size_t batch = 1024;
  size_t per_address = 1000;
  size_t connect_window = 1024;
  std::string tide_store = TIDE_BENCH_TIDE_STORE;
  std::string python = "/usr/bin/python3";
  std::string torch_peer = TIDE_BENCH_TORCH_PEER;
  // Every cell must complete, torch's too (the suite's small run).
  bool strict = false;
};

struct Row {
  std::vector<double> time_s;
  std::vector<double> cpu_s;
  std::vector<double> rss_per_client_kb;
  std::vector<double> bytes_per_client;
  std::vector<std::string> failures;
};

std::string cell_text(const Row& row, int reps) {
  if (row.time_s.empty()) {
    if (row.failures.empty()) {
      return "not run";
    }
    const std::string& why = row.failures.front();
    return why.rfind("not ", 0) == 0 ? why : "failed: " + why;
  }
  Stats s = stats(row.time_s);
  std::string out = s.n > 1 ? fmt::format(
                                  "{} ({} - {})",
                                  format_duration(s.median, 1),
                                  format_duration(s.min, 1),
                                  format_duration(s.max, 1))
                            : format_duration(s.median, 1);
  if (static_cast<int>(s.n) < reps) {
    out += fmt::format(" ({}/{} done: {})", s.n, reps, row.failures.front());
  }
  return out;
}

int run_startup_bench(const StartupOptions& o) {
  auto servers = split(o.servers);
  struct Variant {
    std::string name;
    bool fetch_all;
    std::vector<size_t> counts;
  };
  std::vector<Variant> variants{
      {"barrier", false, parse_counts(o.clients)},
      {"barrier + fetch all", true, parse_counts(o.fetch_clients)}};
  size_t most = 0;
  for (const auto& v : variants) {
    for (size_t n : v.counts) {
      most = std::max(most, n);
    }
  }
  // A socket per client here, and one in the server, which inherits the
  // limit.
  const uint64_t fds = sim::raise_fd_limit(most + sim::kSpareFds);

  // results[variant][n][server]
  std::map<std::string, std::map<size_t, std::map<std::string, Row>>> results;
  // "variant/server" -> the smallest client count it failed at: larger
  // ones are not attempted.
  std::map<std::string, size_t> failed_at;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (const auto& v : variants) {
      for (size_t n : v.counts) {
        for (const auto& name : servers) {
          Row& row = results[v.name][n][name];
          if (rep > 0 && row.time_s.empty() && !row.failures.empty()) {
            continue;  // failed once at this size: not again
          }
          if (n + sim::kSpareFds > fds) {
            if (rep == 0) {
              row.failures.push_back(
                  sim::fd_limit_note(n + sim::kSpareFds, fds));
            }
            continue;
          }
          if (auto f = failed_at.find(v.name + "/" + name);
              f != failed_at.end() && f->second < n) {
            if (rep == 0) {
              row.failures.push_back(fmt::format(
                  "not attempted: failed at {} clients", f->second));
            }
            continue;
          }
          auto server =
              start_server(name, o.tide_store, o.python, o.torch_peer);
          StartupConfig cfg{
              .clients = n,
              .fetch_all = v.fetch_all,
              .batch = o.batch,
              .threads = o.threads,
              .per_address = o.per_address,
              .connect_window = o.connect_window,
              .dialect = name == "tide" ? store::Dialect::kModern
                                        : store::Dialect::kLegacy,
              .timeout_ns = static_cast<int64_t>(o.timeout_s * 1e9)};
          std::fprintf(
              stderr,
              "scale_bench: %s, %zu clients, %s (rep %d)\n",
              v.name.c_str(),
              n,
              server->name().c_str(),
              rep + 1);
          StartupResult r = run_startup(cfg, *server);
          if (!server->alive()) {
            r.ok = false;
            r.error = server->name() + " exited";
          }
          server->stop();
          double t = v.fetch_all ? r.fetch_s : r.barrier_s;
          std::printf(
              "RESULT startup variant=\"%s\" server=%s clients=%zu ok=%d "
              "done=%zu connect_s=%.3f barrier_s=%.3f fetch_s=%.3f "
              "server_cpu_s=%.2f rss_kb=%llu->%llu bytes=%llu error=\"%s\"\n",
              v.name.c_str(),
              name.c_str(),
              n,
              r.ok ? 1 : 0,
              r.done,
              r.connect_s,
              r.barrier_s,
              r.fetch_s,
              r.server_cpu_s,
              static_cast<unsigned long long>(r.rss_before_kb),
              static_cast<unsigned long long>(r.rss_after_kb),
              static_cast<unsigned long long>(r.bytes),
              r.error.c_str());
          std::fflush(stdout);
          if (!r.ok) {
            failed_at.try_emplace(v.name + "/" + name, n);
            row.failures.push_back(fmt::format(
                "{} of {} through in {} s: {}",
                r.done,
                n,
                o.timeout_s,
                r.error));
            continue;
          }
          row.time_s.push_back(t);
          row.cpu_s.push_back(r.server_cpu_s);
          row.rss_per_client_kb.push_back(
              (static_cast<double>(r.rss_after_kb) -
               static_cast<double>(r.rss_before_kb)) /
              static_cast<double>(n));
          row.bytes_per_client.push_back(
              static_cast<double>(r.bytes) / static_cast<double>(n));
        }
      }
    }
  }

  std::printf(
      "\n## Store start-up at scale (%s, %s, %zu client thread(s), %d reps, "
      "bound %.0f s)\n\n",
      now_utc().c_str(),
      kernel().c_str(),
      o.threads,
      o.reps,
      o.timeout_s);
  std::printf(
      "| pattern | clients | tide-store | server CPU | server RSS per client "
      "| bytes per client | torch 1.13 TCPStore | torch CPU | torch / tide "
      "|\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (const auto& v : variants) {
    for (size_t n : v.counts) {
      Row& tide = results[v.name][n]["tide"];
      Row& torch = results[v.name][n]["torch"];
      std::string ratio;
      if (!tide.time_s.empty() && !torch.time_s.empty()) {
        ratio =
            fmt::format("{:.1f}x", median(torch.time_s) / median(tide.time_s));
      }
      std::printf(
          "| %s | %zu | %s | %s | %s | %s | %s | %s | %s |\n",
          v.name.c_str(),
          n,
          cell_text(tide, o.reps).c_str(),
          tide.cpu_s.empty() ? ""
                             : format_duration(median(tide.cpu_s), 0).c_str(),
          tide.rss_per_client_kb.empty()
              ? ""
              : fmt::format("{:.1f} KiB", median(tide.rss_per_client_kb))
                    .c_str(),
          tide.bytes_per_client.empty()
              ? ""
              : fmt::format("{:.0f}", median(tide.bytes_per_client)).c_str(),
          cell_text(torch, o.reps).c_str(),
          torch.cpu_s.empty() ? ""
                              : format_duration(median(torch.cpu_s), 0).c_str(),
          ratio.c_str());
    }
  }
  // tide-store must complete every cell; torch's server only with --strict
  // (at scale its failures are results).
  bool ok = true;
  for (const auto& [variant, by_n] : results) {
    for (const auto& [n, by_server] : by_n) {
      for (const auto& [name, row] : by_server) {
        if ((name == "tide" || o.strict) &&
            static_cast<int>(row.time_s.size()) < o.reps) {
          ok = false;
        }
      }
    }
  }
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------

int bench_main(int argc, char** argv) {
  CLI::App app{
      "the control plane at scale: store start-up with N clients, rendezvous "
      "with N simulated agents"};
  app.require_subcommand(1);

  StartupOptions so;
  auto* startup = app.add_subcommand(
      "startup",
      "init_process_group's start-up barrier (and gloo's fetch of every "
      "peer's address) with N clients, tide-store against torch's TCPStore");
  startup->add_option("--clients", so.clients, "client counts for the barrier")
      ->capture_default_str();
  startup
      ->add_option(
          "--fetch-clients",
          so.fetch_clients,
          "client counts for the barrier + fetch-all pattern (N^2 keys read)")
      ->capture_default_str();
  startup->add_option("--servers", so.servers, "tide,torch")
      ->capture_default_str();
  startup->add_option("--reps", so.reps)->capture_default_str();
  startup->add_option("--timeout", so.timeout_s, "bound per cell, s")
      ->capture_default_str();
  startup->add_option("--threads", so.threads, "client epoll threads")
      ->capture_default_str();
  startup->add_option("--batch", so.batch, "keys per multi_get")
      ->capture_default_str();
  startup
      ->add_option(
          "--per-address", so.per_address, "clients per 127.x source address")
      ->capture_default_str();
  startup
      ->add_option(
          "--connect-window",
          so.connect_window,
          "connects in flight per client thread")
      ->capture_default_str();
  startup->add_flag(
      "--strict", so.strict, "fail unless every cell completes, torch's too");
  startup->add_option("--tide-store", so.tide_store)->capture_default_str();
  startup->add_option("--python", so.python)->capture_default_str();
  startup->add_option("--torch-peer", so.torch_peer)->capture_default_str();

  RendezvousOptions ro;
  auto* rdzv = app.add_subcommand(
      "rendezvous",
      "tide's c10d rendezvous with N simulated agents: a cold round, the "
      "keep-alive traffic, and the re-rendezvous after a node is killed");
  add_rendezvous_options(*rdzv, ro);

  FanInOptions fo;
  auto* fan_in = app.add_subcommand(
      "fan-in",
      "init_process_group's start-up barrier through node-level store "
      "fan-ins (N nodes x R ranks, tide's fan-in code, simulated ranks), "
      "beside the direct design where the descriptors allow it");
  fan_in->add_option("--nodes", fo.nodes, "node counts, a cell each")
      ->capture_default_str();
  fan_in->add_option("--ranks-per-node", fo.ranks_per_node)
      ->capture_default_str();
  fan_in
      ->add_option(
          "--nodes-per-host",
          fo.nodes_per_host,
          "simulated nodes per child process (its descriptors: about 18 "
          "per node)")
      ->capture_default_str();
  fan_in->add_option("--reps", fo.reps)->capture_default_str();
  fan_in->add_option("--timeout", fo.timeout_s, "bound per cell, s")
      ->capture_default_str();
  fan_in->add_option("--tide-store", fo.tide_store)->capture_default_str();
  fan_in
      ->add_option(
          "--dialect",
          fo.dialect,
          "what the ranks speak: modern (torch >= 2.2: VALIDATE and PING "
          "first) or legacy (torch 1.13)")
      ->check(CLI::IsMember({"modern", "legacy"}))
      ->capture_default_str();

  StatusOptions sto;
  auto* status = app.add_subcommand(
      "status",
      "the job's status records with N simulated agents publishing them: "
      "what they cost the store server");
  add_status_options(*status, sto);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  install_interrupt_handlers();
  if (startup->parsed()) {
    return run_startup_bench(so);
  }
  if (status->parsed()) {
    return run_status_bench(sto);
  }
  if (fan_in->parsed()) {
    return run_fan_in_bench(fo);
  }
  return run_rendezvous_bench(ro);
}

}  // namespace
}  // namespace tide::bench::scale

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "node-host") {
      return tide::bench::scale::node_host_main(argc - 1, argv + 1);
    }
    return tide::bench::scale::bench_main(argc, argv);
  } catch (const tide::bench::Interrupted&) {
    return 130;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scale_bench: %s\n", e.what());
    return 1;
  }
}
