#include "rendezvous_sim.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/rendezvous/registry.h"

#include "bench_util.h"
#include "server_process.h"
#include "sim.h"
#include "simulated_agent.h"

namespace tide::bench::scale {

namespace {

using nlohmann::json;

struct Phase {
  double seconds = NAN;
  double server_cpu_s = NAN;
};

struct RunResult {
  std::string error;
  double connect_s = NAN;
  Phase round;
  // The idle job: requests and bytes per second, server CPU share.
  double idle_requests_per_s = NAN;
  double idle_bytes_per_s = NAN;
  double idle_server_cpu = NAN;
  // From the kill: the watcher saw the loss; every survivor in the new round.
  double detect_s = NAN;
  Phase rerendezvous;
  uint64_t round_bytes = 0;
  // The store once every agent holds its rank: its open descriptors (its
  // connections, a listener and a few of its own) and its resident memory.
  size_t server_fds = 0;
  uint64_t server_rss_kb = 0;
};

// The real handlers among the simulated agents: each a thread with a c10d
// handler from tide's registry, doing what the agent does with it.
class RealAgents {
 public:
  RealAgents(int n, const Settings& s, uint16_t port, Tally& tally)
      : tally_(tally) {
    rendezvous::RendezvousParameters p{
        .backend = "c10d",
        .endpoint = "127.0.0.1:" + std::to_string(port),
        .run_id = s.run_id,
        .min_nodes = static_cast<int>(s.min_nodes),
        .max_nodes = static_cast<int>(s.max_nodes),
        .local_addr = "127.0.0.1",
        .config = {
            {"is_host", "false"},
            {"keep_alive_interval",
             fmt::format("{}", static_cast<double>(s.keep_alive_ns) / 1e9)},
            {"keep_alive_max_attempt", std::to_string(s.max_attempts)},
            {"last_call_timeout",
             fmt::format("{}", static_cast<double>(s.last_call_ns) / 1e9)},
            {"join_timeout",
             fmt::format("{}", static_cast<double>(s.join_timeout_ns) / 1e9)},
            {"read_timeout",
             fmt::format("{}", static_cast<double>(s.read_timeout_ns) / 1e9)},
        }};
    for (int i = 0; i < n; ++i) {
      handlers_.push_back(rendezvous::handler_registry().create(p));
    }
  }
  ~RealAgents() {
    stop_ = true;
    for (auto& t : threads_) {
      t.join();
    }
  }
  void go() {
    for (auto& h : handlers_) {
      threads_.emplace_back([this, h = h.get()] {
        try {
          while (!stop_) {
            auto info = h->next_rendezvous();
            tally_.complete(info.round, info.rank, info.world_size, mono_ns());
            while (!stop_ && h->num_nodes_waiting() == 0) {
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
          }
        } catch (const std::exception& e) {
          if (!stop_) {
            tally_.fail(std::string("a real handler failed: ") + e.what());
          }
        }
      });
    }
  }
  void stop() {
    stop_ = true;
    for (auto& h : handlers_) {
      h->set_closed();
    }
  }

 private:
  Tally& tally_;
  std::vector<std::unique_ptr<rendezvous::RendezvousHandler>> handlers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

struct Simulation {
  const RendezvousOptions& o;
  ServerProcess& server;
  size_t n;
  RunResult result;

  Co<void> controller(Job& job, Tally& tally, RealAgents* real) {
    auto poll = [&] { return loop.sleep_until(mono_ns() + 2 * kMs); };
    const int64_t bound = mono_ns() + static_cast<int64_t>(o.timeout_s * 1e9);
    int64_t start = mono_ns();
    while (job.connected() < job.agents().size()) {
      if (mono_ns() > bound) {
        throw TimeoutError(fmt::format(
            "{} of {} agents connected", job.connected(), job.agents().size()));
      }
      co_await poll();
    }
    result.connect_s = static_cast<double>(mono_ns() - start) / 1e9;
    double cpu0 = server.cpu_seconds();
    uint64_t bytes0 = traffic(job).second;
    int64_t go = mono_ns();
    job.go();
    if (real != nullptr) {
      real->go();
    }
    std::optional<int64_t> done;
    while (!(done = tally.complete_round(static_cast<int64_t>(n)))) {
      if (mono_ns() > bound || !tally.error().empty()) {
        throw TimeoutError(
            "the first round did not complete: " +
            (tally.error().empty() ? std::string("out of time")
                                   : tally.error()));
      }
      co_await poll();
    }
    result.round.seconds = static_cast<double>(*done - go) / 1e9;
    result.round.server_cpu_s = server.cpu_seconds() - cpu0;
    result.round_bytes = traffic(job).second - bytes0;
    result.server_fds = server.open_fds();
    result.server_rss_kb = server.rss_kb();
    if (!o.kill) {
      co_return;
    }
    // The idle job: two intervals to settle, then o.idle_s measured.
    co_await loop.sleep_until(mono_ns() + 2 * job.settings().keep_alive_ns);
    auto [req0, by0] = traffic(job);
    double c0 = server.cpu_seconds();
    int64_t t0 = mono_ns();
    co_await loop.sleep_until(t0 + static_cast<int64_t>(o.idle_s * 1e9));
    auto [req1, by1] = traffic(job);
    double idle = static_cast<double>(mono_ns() - t0) / 1e9;
    result.idle_requests_per_s = static_cast<double>(req1 - req0) / idle;
    result.idle_bytes_per_s = static_cast<double>(by1 - by0) / idle;
    result.idle_server_cpu = (server.cpu_seconds() - c0) / idle;

    // Kill the simulated agent nearest the middle of the arrival ring.
    Agent* victim = &job.agents().front();
    auto off = [&](const Agent& a) {
      return std::abs(a.index - static_cast<int64_t>(n / 2));
    };
    for (Agent& a : job.agents()) {
      if (off(a) < off(*victim)) {
        victim = &a;
      }
    }
    victim->killed = true;
    victim->conn->close();
    double cpu_kill = server.cpu_seconds();
    int64_t kill = mono_ns();
    const int64_t survivors = static_cast<int64_t>(n) - 1;
    while (!(done = tally.complete_round(survivors))) {
      if (mono_ns() > kill + static_cast<int64_t>(o.timeout_s * 1e9) ||
          !tally.error().empty()) {
        throw TimeoutError(
            "the survivors did not form a new round: " +
            (tally.error().empty() ? std::string("out of time")
                                   : tally.error()));
      }
      co_await poll();
    }
    int64_t seen = 0;
    for (Agent& a : job.agents()) {
      if (a.lost_at_ns > kill && (seen == 0 || a.lost_at_ns < seen)) {
        seen = a.lost_at_ns;
      }
    }
    result.detect_s = seen > 0 ? static_cast<double>(seen - kill) / 1e9 : NAN;
    result.rerendezvous.seconds = static_cast<double>(*done - kill) / 1e9;
    result.rerendezvous.server_cpu_s = server.cpu_seconds() - cpu_kill;
  }

  static std::pair<uint64_t, uint64_t> traffic(Job& job) {
    uint64_t req = 0;
    uint64_t bytes = 0;
    auto count = [&](const sim::ConnStats& s) {
      req += s.requests;
      bytes += s.bytes_in + s.bytes_out;
    };
    for (Agent& a : job.agents()) {
      count(a.conn->stats());
    }
    return {req, bytes};
  }

  sim::Loop loop;
};

RunResult run_once(const RendezvousOptions& o, size_t n, int rep) {
  auto server = std::make_unique<ServerProcess>(
      "tide-store",
      std::vector<std::string>{
          o.tide_store, "--host", "127.0.0.1", "--port", "0"},
      sim::kServerStartTimeout);
  Settings s{
      .run_id = fmt::format("scale{}_{}", n, rep),
      .min_nodes = o.kill ? static_cast<int64_t>(n) - o.spare_nodes
                          : static_cast<int64_t>(n),
      .max_nodes = static_cast<int64_t>(n),
      .keep_alive_ns = static_cast<int64_t>(o.keep_alive_s * 1e9),
      .max_attempts = o.keep_alive_max_attempt,
      .last_call_ns = static_cast<int64_t>(o.last_call_s * 1e9),
      .join_timeout_ns = static_cast<int64_t>(o.timeout_s * 1e9),
      .read_timeout_ns = static_cast<int64_t>(o.timeout_s * 1e9)};
  Tally tally;
  Simulation simulation{.o = o, .server = *server, .n = n};
  std::unique_ptr<RealAgents> real;
  size_t simulated = n - static_cast<size_t>(o.real_agents);
  if (o.real_agents > 0) {
    real =
        std::make_unique<RealAgents>(o.real_agents, s, server->port(), tally);
  }
  Job job(simulation.loop, s, tally);
  job.agents().resize(simulated);
  for (size_t i = 0; i < simulated; ++i) {
    Agent& a = job.agents()[i];
    a.id = i;
    // One connection per agent, as tiderun's agents keep (a MuxStore the
    // handler, its keep-alive and its status records share).
    a.conn = std::make_unique<sim::Conn>(
        simulation.loop,
        sim::ConnOptions{
            .port = server->port(),
            .source = sim::source_address(i, o.per_address),
            .tagged = true,
            .connect_timeout_ns = s.read_timeout_ns});
    a.descriptor = json{
        {"addr", "127.0.0.1"},
        {"pid", static_cast<int64_t>(::getpid())},
        {"local_id", static_cast<int64_t>(i)},
        {"host", "sim" + std::to_string(i)},
        {"rank_order",
         "arrival"}}.dump();
    simulation.loop.spawn(
        job.agent_life(a), [&tally, &job, &a](std::exception_ptr e) {
          if (e && !job.stopping() && !a.killed) {
            try {
              std::rethrow_exception(e);
            } catch (const std::exception& x) {
              tally.fail(std::string("a simulated agent failed: ") + x.what());
            }
          }
        });
  }
  std::string error;
  simulation.loop.spawn(
      simulation.controller(job, tally, real.get()), [&](std::exception_ptr e) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            error = x.what();
          }
        }
        job.stop();
        simulation.loop.stop();
      });
  simulation.loop.run(
      mono_ns() + static_cast<int64_t>((3 * o.timeout_s + o.idle_s) * 1e9));
  job.stop();
  if (real) {
    real->stop();
  }
  // Every coroutine sees the stop when it next wakes (within a keep-alive
  // interval); then whatever still waits on a connection is failed.
  simulation.loop.run(mono_ns() + 2 * s.keep_alive_ns + 2'000 * kMs);
  simulation.loop.begin_teardown();
  for (Agent& a : job.agents()) {
    a.conn->close();
  }
  simulation.loop.run(mono_ns() + 1'000 * kMs);
  real.reset();
  RunResult r = simulation.result;
  r.error = error.empty() ? tally.error() : error;
  return r;
}

std::string seconds_cell(const std::vector<double>& v) {
  if (v.empty()) {
    return "";
  }
  Stats s = stats(v);
  return s.n > 1 ? fmt::format(
                       "{} ({} - {})",
                       format_duration(s.median, 0),
                       format_duration(s.min, 0),
                       format_duration(s.max, 0))
                 : format_duration(s.median, 0);
}

}  // namespace

void add_rendezvous_options(CLI::App& app, RendezvousOptions& o) {
  app.add_option("--nodes", o.nodes, "simulated node counts (4096 or 4k)")
      ->capture_default_str();
  app.add_option("--reps", o.reps)->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "bound on each phase, s")
      ->capture_default_str();
  app.add_flag(
      "--kill,!--no-kill",
      o.kill,
      "after the round, measure the idle keep-alives, kill one agent and time "
      "the survivors' new round");
  app.add_option("--idle", o.idle_s, "seconds of idle keep-alive measured")
      ->capture_default_str();
  app.add_option("--keep-alive-interval", o.keep_alive_s, "s")
      ->capture_default_str();
  app.add_option("--keep-alive-max-attempt", o.keep_alive_max_attempt)
      ->capture_default_str();
  app.add_option("--last-call", o.last_call_s, "last_call_timeout, s")
      ->capture_default_str();
  app.add_option(
         "--spare-nodes",
         o.spare_nodes,
         "with --kill: min_nodes = N - this (the job tolerates losing that "
         "many nodes)")
      ->capture_default_str();
  app.add_option(
         "--real-agents",
         o.real_agents,
         "of the N, this many are real c10d handlers (threads), a check that "
         "the simulation speaks the protocol")
      ->capture_default_str();
  app.add_option(
         "--per-address", o.per_address, "connections per 127.x source address")
      ->capture_default_str();
  app.add_option("--tide-store", o.tide_store)->capture_default_str();
}

int run_rendezvous_bench(const RendezvousOptions& o) {
  auto ns = parse_counts(o.nodes, 4);
  size_t most = *std::max_element(ns.begin(), ns.end());
  // One connection per agent, here and in the server.
  const uint64_t fds = sim::raise_fd_limit(most + sim::kSpareFds);
  struct Cells {
    std::vector<double> connect, round, round_cpu, round_bytes, idle_req,
        idle_bytes, idle_cpu, detect, rerdzv, rerdzv_cpu, fds, rss_kb;
    std::vector<std::string> errors;
    std::string skipped;
  };
  std::map<size_t, Cells> cells;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t n : ns) {
      if (n + sim::kSpareFds > fds) {
        cells[n].skipped = sim::fd_limit_note(n + sim::kSpareFds, fds);
        continue;
      }
      std::fprintf(
          stderr, "scale_bench: rendezvous, %zu nodes (rep %d)\n", n, rep + 1);
      RunResult r = run_once(o, n, rep);
      std::printf(
          "RESULT rendezvous nodes=%zu ok=%d connect_s=%.3f round_s=%.3f "
          "round_server_cpu_s=%.2f round_bytes=%llu idle_req_per_s=%.0f "
          "idle_bytes_per_s=%.0f idle_server_cpu=%.3f detect_s=%.3f "
          "rerendezvous_s=%.3f rerendezvous_server_cpu_s=%.2f server_fds=%zu "
          "server_rss_kb=%llu error=\"%s\"\n",
          n,
          r.error.empty() ? 1 : 0,
          r.connect_s,
          r.round.seconds,
          r.round.server_cpu_s,
          static_cast<unsigned long long>(r.round_bytes),
          r.idle_requests_per_s,
          r.idle_bytes_per_s,
          r.idle_server_cpu,
          r.detect_s,
          r.rerendezvous.seconds,
          r.rerendezvous.server_cpu_s,
          r.server_fds,
          static_cast<unsigned long long>(r.server_rss_kb),
          r.error.c_str());
      std::fflush(stdout);
      Cells& c = cells[n];
      if (!r.error.empty()) {
        c.errors.push_back(r.error);
        continue;
      }
      c.connect.push_back(r.connect_s);
      c.round.push_back(r.round.seconds);
      c.round_cpu.push_back(r.round.server_cpu_s);
      c.round_bytes.push_back(
          static_cast<double>(r.round_bytes) / static_cast<double>(n));
      c.fds.push_back(static_cast<double>(r.server_fds));
      c.rss_kb.push_back(static_cast<double>(r.server_rss_kb));
      if (o.kill) {
        c.idle_req.push_back(r.idle_requests_per_s);
        c.idle_bytes.push_back(r.idle_bytes_per_s);
        c.idle_cpu.push_back(r.idle_server_cpu);
        c.detect.push_back(r.detect_s);
        c.rerdzv.push_back(r.rerendezvous.seconds);
        c.rerdzv_cpu.push_back(r.rerendezvous.server_cpu_s);
      }
    }
  }
  std::printf(
      "\n## Rendezvous at scale (%s, %s, %d reps; keep_alive_interval=%g s, "
      "keep_alive_max_attempt=%d, last_call_timeout=%g s%s)\n\n",
      now_utc().c_str(),
      kernel().c_str(),
      o.reps,
      o.keep_alive_s,
      o.keep_alive_max_attempt,
      o.last_call_s,
      o.real_agents > 0
          ? fmt::format(", {} real handlers among the agents", o.real_agents)
                .c_str()
          : "");
  std::printf(
      "| nodes | round | per node | server CPU | bytes per node | store "
      "connections | store RSS | idle keep-alive requests/s | idle server CPU "
      "| loss seen | re-rendezvous after kill | failed "
      "|\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--|\n");
  bool ok = true;
  for (auto& [n, c] : cells) {
    ok = ok && c.errors.empty();
    std::printf(
        "| %zu | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
        n,
        seconds_cell(c.round).c_str(),
        c.round.empty()
            ? ""
            : fmt::format(
                  "{:.0f} us", median(c.round) / static_cast<double>(n) * 1e6)
                  .c_str(),
        c.round_cpu.empty() ? ""
                            : format_duration(median(c.round_cpu), 0).c_str(),
        c.round_bytes.empty()
            ? ""
            : fmt::format("{:.0f}", median(c.round_bytes)).c_str(),
        c.fds.empty() ? "" : fmt::format("{:.0f}", median(c.fds)).c_str(),
        c.rss_kb.empty()
            ? ""
            : fmt::format("{:.0f} MiB", median(c.rss_kb) / 1024).c_str(),
        c.idle_req.empty() ? ""
                           : fmt::format("{:.0f}", median(c.idle_req)).c_str(),
        c.idle_cpu.empty()
            ? ""
            : fmt::format("{:.0f}%", 100 * median(c.idle_cpu)).c_str(),
        seconds_cell(c.detect).c_str(),
        seconds_cell(c.rerdzv).c_str(),
        !c.skipped.empty()
            ? c.skipped.c_str()
            : (c.errors.empty()
                   ? ""
                   : (std::to_string(c.errors.size()) + ": " + c.errors.front())
                         .c_str()));
  }
  return ok ? 0 : 1;
}

}  // namespace tide::bench::scale
