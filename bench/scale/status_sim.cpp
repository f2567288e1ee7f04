#include "status_sim.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <fmt/format.h>

#include "tide/status/job_status.h"

#include "agent/status_publisher.h"
#include "bench_util.h"
#include "rendezvous/store_keys.h"
#include "server_process.h"
#include "sim.h"

namespace tide::bench::scale {

// Named, not anonymous: the unity build puts this file beside
// rendezvous_sim.cpp, whose anonymous namespace has a Simulation too.
namespace board {

using sim::Co;

// A record as an agent of `ranks` workers writes it, every field filled.
std::string record(size_t slot, int ranks, int nodes, double interval) {
  status::NodeStatus s{
      .node = fmt::format("node-{:05d}.cluster.example.com", slot),
      .slot = static_cast<int64_t>(slot),
      .health = fmt::format("node-{:05d}.cluster.example.com:8080", slot),
      .pid = 400000 + static_cast<int64_t>(slot),
      .role = "default",
      .state = "HEALTHY",
      .round = 3,
      .group_rank = static_cast<int>(slot),
      .group_world_size = nodes,
      .restarts = 1,
      .max_restarts = 3,
      .last_restart_at = 1.8e9,
      .last_restart_reason = "membership changed: 1 node(s) waiting or lost",
      .started_at = 1.8e9,
      .updated_at = 1.8e9,
      .interval = interval,
  };
  for (int r = 0; r < ranks; ++r) {
    s.ranks.push_back(status::RankStatus{
        .local_rank = r,
        .rank = static_cast<int>(slot) * ranks + r,
        .pid = 500000 + r,
        .state = "HEALTHY",
        .beat_age = 0.123456,
        .step = 123456,
        .step_time = 0.0512345,
        .best_step_time = 0.0498765,
    });
  }
  return status::to_json(s);
}

struct Cell {
  double interval = 0;
  double requests_per_s = 0;
  double bytes_per_s = 0;
  double server_cpu = 0;  // share of one core, publishing
  double idle_cpu = 0;    // share of one core, the same connections idle
  double leader_read_s = 0;
  std::string error;
};

struct Simulation {
  const StatusOptions& o;
  ServerProcess& server;
  size_t n;
  double interval;  // effective, s
  std::string prefix;
  std::vector<std::unique_ptr<sim::Conn>> conns;
  std::vector<int64_t> leader_reads;
  size_t claimed = 0;
  int64_t go_ns = 0;  // when the publishers start writing
  bool stopping = false;
  sim::Loop loop;

  std::string key(const std::string& k) const {
    return prefix + "/" + k;
  }

  // One agent's publisher: claim a slot, then every interval (at a random
  // phase) write the record and read the job's figure, or, as the leader
  // (slot 0), read every record and write the figure.
  Co<void> publisher(size_t i, int64_t phase_ns) {
    sim::Conn& c = *conns[i];
    co_await c.connect();
    int64_t slot = co_await c.add(key("slots"), 1) - 1;
    std::string body = record(
        static_cast<size_t>(slot),
        o.ranks_per_node,
        static_cast<int>(n),
        interval);
    co_await c.set(key("attempts/" + std::to_string(slot)), "[]");
    co_await c.set(key("node/" + std::to_string(slot)), body);
    ++claimed;
    while (go_ns == 0 && !stopping) {
      co_await loop.sleep_until(mono_ns() + 5'000'000);
    }
    const int64_t every = static_cast<int64_t>(interval * 1e9);
    uint64_t writes = 0;
    int64_t next = go_ns + phase_ns;
    while (!stopping) {
      co_await loop.sleep_until(next);
      next += every;
      if (stopping) {
        break;
      }
      co_await c.set(key("node/" + std::to_string(slot)), body);
      // As StatusPublisher: the figure at one write in kFigureEvery, made
      // by the leader from every record, read by the others.
      if (writes++ % agent::detail::StatusPublisher::kFigureEvery != 0) {
        continue;
      }
      if (slot != 0) {
        co_await c.compare_set(
            key("job"),
            std::string(rendezvous::kAbsent),
            std::string(rendezvous::kAbsent));
        continue;
      }
      int64_t start = mono_ns();
      int64_t slots = co_await c.add(key("slots"), 0);
      std::vector<std::string> keys;
      for (int64_t s = 0; s < slots; ++s) {
        keys.push_back(key("node/" + std::to_string(s)));
        keys.push_back(key("attempts/" + std::to_string(s)));
      }
      if (co_await c.check(keys)) {
        auto values = co_await c.multi_get(std::move(keys));
        if (values.size() != 2 * static_cast<size_t>(slots)) {
          throw ProtocolError("the leader read the wrong number of records");
        }
      }
      co_await c.set(key("job"), R"({"fastest_step_time":0.0498765})");
      leader_reads.push_back(mono_ns() - start);
    }
  }

  std::pair<uint64_t, uint64_t> traffic() const {
    uint64_t req = 0;
    uint64_t bytes = 0;
    for (const auto& c : conns) {
      req += c->stats().requests;
      bytes += c->stats().bytes_in + c->stats().bytes_out;
    }
    return {req, bytes};
  }

  Co<void> controller(Cell& cell) {
    const int64_t bound = mono_ns() + static_cast<int64_t>(o.timeout_s * 1e9);
    while (claimed < n) {
      if (mono_ns() > bound) {
        throw TimeoutError(
            fmt::format("{} of {} agents connected", claimed, n));
      }
      co_await loop.sleep_until(mono_ns() + 5'000'000);
    }
    // The server with every connection open and idle: the floor that
    // publishing adds to.
    double idle0 = server.cpu_seconds();
    int64_t i0 = mono_ns();
    co_await loop.sleep_until(i0 + static_cast<int64_t>(o.idle_s * 1e9));
    cell.idle_cpu = (server.cpu_seconds() - idle0) /
                    (static_cast<double>(mono_ns() - i0) / 1e9);
    // Go; one interval for every publisher to be at its pace, then measured.
    go_ns = mono_ns();
    co_await loop.sleep_until(go_ns + static_cast<int64_t>(interval * 1e9));
    auto [req0, bytes0] = traffic();
    double cpu0 = server.cpu_seconds();
    int64_t t0 = mono_ns();
    leader_reads.clear();
    co_await loop.sleep_until(
        t0 + static_cast<int64_t>(o.intervals * interval * 1e9));
    auto [req1, bytes1] = traffic();
    double wall = static_cast<double>(mono_ns() - t0) / 1e9;
    cell.requests_per_s = static_cast<double>(req1 - req0) / wall;
    cell.bytes_per_s = static_cast<double>(bytes1 - bytes0) / wall;
    cell.server_cpu = (server.cpu_seconds() - cpu0) / wall;
    std::vector<double> reads;
    for (int64_t ns : leader_reads) {
      reads.push_back(static_cast<double>(ns) / 1e9);
    }
    cell.leader_read_s = reads.empty() ? NAN : median(reads);
  }
};

Cell run_once(const StatusOptions& o, size_t n, int rep) {
  ServerProcess server(
      "tide-store",
      std::vector<std::string>{
          o.tide_store, "--host", "127.0.0.1", "--port", "0"},
      sim::kServerStartTimeout);
  double interval =
      status::effective_status_interval(o.interval_s, static_cast<int>(n));
  Simulation simulation{
      .o = o,
      .server = server,
      .n = n,
      .interval = interval,
      .prefix =
          rendezvous::StoreKeys(fmt::format("status{}_{}", n, rep)).status()};
  Cell cell{.interval = interval};
  std::mt19937_64 rng(static_cast<uint64_t>(rep) * 7919 + n);
  std::uniform_int_distribution<int64_t> phase(
      0, static_cast<int64_t>(interval * 1e9));
  for (size_t i = 0; i < n; ++i) {
    simulation.conns.push_back(std::make_unique<sim::Conn>(
        simulation.loop,
        sim::ConnOptions{
            .port = server.port(),
            .source = sim::source_address(i, o.per_address),
            .connect_timeout_ns = static_cast<int64_t>(o.timeout_s * 1e9)}));
    simulation.loop.spawn(
        simulation.publisher(i, phase(rng)), [&](std::exception_ptr e) {
          if (e && !simulation.stopping && cell.error.empty()) {
            try {
              std::rethrow_exception(e);
            } catch (const std::exception& x) {
              cell.error = std::string("a publisher failed: ") + x.what();
            }
          }
        });
  }
  simulation.loop.spawn(simulation.controller(cell), [&](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        cell.error = x.what();
      }
    }
    simulation.stopping = true;
    simulation.loop.stop();
  });
  simulation.loop.run(
      mono_ns() +
      static_cast<int64_t>((o.timeout_s + (o.intervals + 2) * interval) * 1e9));
  simulation.stopping = true;
  simulation.loop.begin_teardown();
  for (auto& c : simulation.conns) {
    c->close();
  }
  simulation.loop.run(mono_ns() + 1'000'000'000);
  return cell;
}

}  // namespace board

void add_status_options(CLI::App& app, StatusOptions& o) {
  app.add_option("--nodes", o.nodes, "simulated node counts (8192 or 8k)")
      ->capture_default_str();
  app.add_option("--reps", o.reps)->capture_default_str();
  app.add_option(
         "--status-interval", o.interval_s, "the agents' --status-interval, s")
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node)->capture_default_str();
  app.add_option(
         "--intervals", o.intervals, "effective intervals measured per cell")
      ->capture_default_str();
  app.add_option("--idle", o.idle_s, "seconds of the idle server measured")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "bound on connecting, s")
      ->capture_default_str();
  app.add_option(
         "--per-address", o.per_address, "connections per 127.x source address")
      ->capture_default_str();
  app.add_option("--tide-store", o.tide_store)->capture_default_str();
}

int run_status_bench(const StatusOptions& o) {
  using board::Cell;
  auto ns = parse_counts(o.nodes, 2);
  size_t most = *std::max_element(ns.begin(), ns.end());
  const uint64_t fds = sim::raise_fd_limit(most + sim::kSpareFds);
  std::map<size_t, std::vector<Cell>> cells;
  std::map<size_t, std::string> skipped;
  bool ok = true;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t n : ns) {
      if (n + sim::kSpareFds > fds) {
        skipped[n] = sim::fd_limit_note(n + sim::kSpareFds, fds);
        continue;
      }
      std::fprintf(
          stderr, "scale_bench: status, %zu nodes (rep %d)\n", n, rep + 1);
      Cell c = board::run_once(o, n, rep);
      std::printf(
          "RESULT status nodes=%zu ok=%d interval_s=%.2f requests_per_s=%.0f "
          "bytes_per_s=%.0f server_cpu=%.4f idle_server_cpu=%.4f "
          "leader_read_s=%.3f error=\"%s\"\n",
          n,
          c.error.empty() ? 1 : 0,
          c.interval,
          c.requests_per_s,
          c.bytes_per_s,
          c.server_cpu,
          c.idle_cpu,
          c.leader_read_s,
          c.error.c_str());
      std::fflush(stdout);
      ok = ok && c.error.empty();
      if (c.error.empty()) {
        cells[n].push_back(c);
      }
    }
  }
  std::printf(
      "\n## Status records at scale (%s, %s, %d reps; --status-interval %g s, "
      "%d ranks a node)\n\n"
      "| nodes | interval | requests/s | bytes/s | server CPU (one core), "
      "publishing | the same, idle | leader's read of every record "
      "|\n|--:|--:|--:|--:|--:|--:|--:|\n",
      now_utc().c_str(),
      kernel().c_str(),
      o.reps,
      o.interval_s,
      o.ranks_per_node);
  for (size_t n : ns) {
    if (skipped.count(n) != 0U) {
      std::printf(
          "| %zu | not run here (%s) | | | | | |\n", n, skipped[n].c_str());
      continue;
    }
    auto pick = [&](double Cell::*f) {
      std::vector<double> v;
      for (const Cell& c : cells[n]) {
        v.push_back(c.*f);
      }
      return v.empty() ? NAN : median(v);
    };
    std::printf(
        "| %zu | %s | %.0f | %.0f KB/s | %.2f%% | %.2f%% | %s |\n",
        n,
        format_duration(pick(&Cell::interval), 0).c_str(),
        pick(&Cell::requests_per_s),
        pick(&Cell::bytes_per_s) / 1000,
        100 * pick(&Cell::server_cpu),
        100 * pick(&Cell::idle_cpu),
        format_duration(pick(&Cell::leader_read_s), 0).c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace tide::bench::scale
