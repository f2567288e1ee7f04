// quorum_bench: what per-step fault tolerance costs a training step. N
// replica groups (one rank each) run rounds of start_quorum() +
// should_commit(true) against a real tide-store process; each round's cost
// to a group is the time it spends in the two calls, and the store's is the
// CPU it spends per round (what one coordinating server pays, whatever the
// machines the groups are on). Two ways to make N groups on one machine:
//
//   threads    every group a tide::ft::QuorumClient on a thread of its own:
//              N threads and N heartbeat threads share these cores with
//              the store, each woken once a round.
//   simulated  one QuorumClient (the group measured) among N - 1 simulated
//              groups: coroutines on one epoll thread that send what a
//              group sends (its vote, its decision when its vote is the
//              last, its heartbeat every 100 ms, each on a connection of
//              its own), as groups on machines of their own would. All N
//              join and vote as QuorumClients for the first rounds; the
//              simulated ones then take over the N - 1 groups' votes.
//
// Beside them, the physical reference: one request's round trip to the
// same server.
//
//   quorum_bench [--groups 2,8,64] [--rounds 300] [--modes threads,simulated]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include <unistd.h>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tide/ft/quorum.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "bench_util.h"
#include "server_process.h"
#include "sim.h"

namespace {

using namespace std::chrono_literals;
using tide::ft::QuorumClient;
using tide::ft::QuorumOptions;

namespace sim = tide::bench::sim;

// Rounds every group votes in as a QuorumClient before the simulated
// groups take over (simulated mode).
constexpr int64_t kHandoff = 3;

struct Cell {
  size_t groups = 0;
  double median = 0;  // s, one group's two calls in one round
  double p90 = 0;
  double slowest = 0;    // s, the slowest group of a round, median
  double store_cpu = 0;  // s of the store's CPU per round
  double group_cpu = 0;  // s of the groups' CPU per round, all together
};

// A simulated group's votes, rounds [first, end) of the quorum record
// written at round `record`: what QuorumClient::should_commit(true) sends
// on a fast quorum (its one ADD_WAIT on the record's counter; when its vote
// completes the count, the decision).
sim::Co<void> simulated_votes(
    sim::Conn& c,
    std::string prefix,
    int64_t record,
    int64_t first,
    int64_t end,
    int64_t total,
    size_t& voting) {
  co_await c.connect();
  std::string votes = prefix + "round/" + std::to_string(record) + "/votes";
  for (int64_t r = first; r < end; ++r) {
    std::string done = prefix + "round/" + std::to_string(r) + "/done";
    sim::Conn::Tally t =
        co_await c.add_wait(votes, 1, (r - record + 1) * total, done);
    std::string outcome = std::move(t.value);
    if (outcome.empty()) {
      int64_t changes = co_await c.add(prefix + "changes", 0);
      outcome = co_await c.compare_set(
          done, "", "commit " + std::to_string(changes));
    }
    if (!outcome.starts_with("commit ")) {
      throw std::runtime_error("round " + std::to_string(r) + ": " + outcome);
    }
  }
  --voting;
}

// A simulated group's heartbeat, on a connection of its own, while any
// simulated group votes.
sim::Co<void> simulated_beats(
    sim::Loop& loop, sim::Conn& c, std::string key, const size_t& voting) {
  co_await c.connect();
  while (voting > 0) {
    co_await c.add(key, 1);
    co_await loop.sleep_until(tide::bench::mono_ns() + 100'000'000);
  }
}

Cell run(
    tide::bench::ServerProcess& server,
    size_t groups,
    size_t rounds,
    int job,
    bool simulated) {
  uint16_t port = server.port();
  std::string prefix = "bench" + std::to_string(job);
  auto connect = [port, prefix] {
    return std::make_shared<tide::store::PrefixStore>(
        prefix,
        std::make_shared<tide::store::TcpStore>(tide::store::TcpStoreOptions{
            .port = port,
            .dialect = tide::store::Dialect::kModern,
            .timeout = 60s}));
  };
  size_t warmup = 20;
  size_t measured = simulated ? 1 : groups;
  std::vector<std::vector<double>> times(measured);
  std::vector<std::thread> threads;
  std::atomic<int64_t> handed_over{-1};
  std::atomic<int64_t> record{-1};
  double cpu0 = server.cpu_seconds();
  double own0 = tide::bench::cpu_seconds_of(::getpid());
  for (size_t g = 0; g < groups; ++g) {
    threads.emplace_back([&, g] {
      QuorumClient c(
          connect,
          QuorumOptions{
              .group = "g" + std::to_string(g),
              .incarnation = "0",
              .expected_groups = static_cast<int>(groups),
              .heartbeat_timeout = 60s},
          0);
      bool simulated_later = simulated && g > 0;
      size_t all = simulated_later ? kHandoff : kHandoff + warmup + rounds;
      for (size_t r = 0; r < all; ++r) {
        int64_t t0 = tide::bench::mono_ns();
        tide::ft::Quorum q = c.start_quorum();
        if (!c.should_commit(true)) {
          std::fprintf(stderr, "quorum_bench: a round did not commit\n");
          std::exit(1);
        }
        int64_t t1 = tide::bench::mono_ns();
        if (r >= kHandoff + warmup) {
          times[g].push_back(static_cast<double>(t1 - t0) / 1e9);
        }
        if (simulated_later) {
          handed_over = q.round + 1;
          record = q.id;
        }
      }
    });
  }
  if (simulated && groups > 1) {
    for (size_t g = 1; g < groups; ++g) {
      threads[g].join();
    }
    int64_t first = handed_over.load();
    int64_t end = first + static_cast<int64_t>(warmup + rounds);
    sim::Loop loop;
    std::vector<std::unique_ptr<sim::Conn>> conns;
    size_t voting = groups - 1;
    for (size_t g = 1; g < groups; ++g) {
      for (int k = 0; k < 2; ++k) {
        conns.push_back(
            std::make_unique<sim::Conn>(loop, sim::ConnOptions{.port = port}));
      }
      auto& votes = *conns[conns.size() - 2];
      auto& beats = *conns.back();
      loop.spawn(
          simulated_votes(
              votes,
              prefix + "/",
              record.load(),
              first,
              end,
              static_cast<int64_t>(groups),
              voting),
          [](std::exception_ptr e) {
            if (e) {
              std::rethrow_exception(e);
            }
          });
      loop.spawn(simulated_beats(
          loop, beats, prefix + "/hb/g" + std::to_string(g) + ":0", voting));
    }
    loop.run(tide::bench::mono_ns() + 600'000'000'000);
  }
  for (auto& t : threads) {
    if (t.joinable()) {
      t.join();
    }
  }
  auto total_rounds = static_cast<double>(kHandoff + warmup + rounds);
  double store_cpu = (server.cpu_seconds() - cpu0) / total_rounds;
  double group_cpu =
      (tide::bench::cpu_seconds_of(::getpid()) - own0) / total_rounds;
  std::vector<double> all, slowest(rounds, 0.0);
  for (const auto& v : times) {
    for (size_t r = 0; r < v.size(); ++r) {
      all.push_back(v[r]);
      slowest[r] = std::max(slowest[r], v[r]);
    }
  }
  return {
      groups,
      tide::bench::median(all),
      tide::bench::percentile(all, 90),
      tide::bench::median(slowest),
      store_cpu,
      group_cpu};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "quorum_bench: the per-step cost of tide.ft's quorum and commit");
  std::string groups_list = "2,8,64";
  size_t rounds = 300;
  std::string modes = "threads,simulated";
  app.add_option("--groups", groups_list, "replica groups per cell");
  app.add_option("--rounds", rounds, "measured rounds per cell");
  app.add_option(
      "--modes",
      modes,
      "threads (every group a QuorumClient thread), simulated (one "
      "QuorumClient among simulated groups), or both");
  CLI11_PARSE(app, argc, argv);
  bool with_threads = modes.find("threads") != std::string::npos;
  bool with_simulated = modes.find("simulated") != std::string::npos;
  if (!with_threads && !with_simulated) {
    std::fprintf(stderr, "quorum_bench: --modes: threads, simulated or both\n");
    return 2;
  }

  tide::bench::ServerProcess server(
      "tide-store",
      {TIDE_BENCH_TIDE_STORE, "--port", "0"},
      std::chrono::seconds(10));
  uint16_t port = server.port();
  // The physical reference: a request's round trip (CHECK of an absent key).
  std::vector<double> rtt;
  {
    tide::store::TcpStore s(
        {.port = port,
         .dialect = tide::store::Dialect::kModern,
         .timeout = 10s});
    for (int i = 0; i < 2000; ++i) {
      int64_t t0 = tide::bench::mono_ns();
      s.check({"absent"});
      rtt.push_back(static_cast<double>(tide::bench::mono_ns() - t0) / 1e9);
    }
  }
  double ref = tide::bench::median(rtt);
  std::printf(
      "# quorum_bench %s, load %s\n",
      tide::bench::now_utc().c_str(),
      tide::bench::load_average().c_str());
  std::printf("store round trip (median): %.1f us\n\n", ref * 1e6);
  std::printf(
      "| groups | how | per group, median | p90 | slowest group, median | "
      "in round trips | store CPU per round | groups' CPU per round |\n"
      "|---:|---|---:|---:|---:|---:|---:|---:|\n");
  int job = 0;
  for (size_t n : tide::bench::parse_counts(groups_list)) {
    for (bool simulated : {false, true}) {
      if (!(simulated ? with_simulated : with_threads)) {
        continue;
      }
      Cell c = run(server, n, rounds, job++, simulated);
      std::string slowest =
          simulated ? "-" : fmt::format("{:.3f} ms", c.slowest * 1e3);
      std::printf(
          "| %zu | %s | %.3f ms | %.3f ms | %s | %.1f | %.3f ms | %.3f ms "
          "|\n",
          n,
          simulated ? "1 client + simulated" : "threads",
          c.median * 1e3,
          c.p90 * 1e3,
          slowest.c_str(),
          c.median / ref,
          c.store_cpu * 1e3,
          c.group_cpu * 1e3);
      std::fflush(stdout);
    }
  }
  return 0;
}
