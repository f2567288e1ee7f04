// quorum_bench: what per-step fault tolerance costs a training step. N
// simulated replica groups (one thread and one tide::ft::QuorumClient each,
// one rank per group) run rounds of start_quorum() + should_commit(true)
// against a real tide-store process; each round's cost to a group is the
// time it spends in the two calls, and the store's is the CPU it spends per
// round (what one coordinating server pays, whatever the machines the
// groups are on). Beside it, the physical reference: one request's round
// trip to the same server.
//
//   quorum_bench [--groups 2,8,64] [--rounds 300]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "tide/ft/quorum.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "bench_util.h"
#include "server_process.h"

namespace {

using namespace std::chrono_literals;
using tide::ft::QuorumClient;
using tide::ft::QuorumOptions;

struct Cell {
  size_t groups = 0;
  double median = 0;  // s, one group's two calls in one round
  double p90 = 0;
  double slowest = 0;    // s, the slowest group of a round, median
  double store_cpu = 0;  // s of the store's CPU per round
};

Cell run(
    tide::bench::ServerProcess& server, size_t groups, size_t rounds, int job) {
  uint16_t port = server.port();
  auto connect = [port, job] {
    return std::make_shared<tide::store::PrefixStore>(
        "bench" + std::to_string(job),
        std::make_shared<tide::store::TcpStore>(tide::store::TcpStoreOptions{
            .port = port,
            .dialect = tide::store::Dialect::kModern,
            .timeout = 60s}));
  };
  size_t warmup = 20;
  std::vector<std::vector<double>> times(groups);
  std::vector<std::thread> threads;
  double cpu0 = server.cpu_seconds();
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
      for (size_t r = 0; r < warmup + rounds; ++r) {
        int64_t t0 = tide::bench::mono_ns();
        c.start_quorum();
        if (!c.should_commit(true)) {
          std::fprintf(stderr, "quorum_bench: a round did not commit\n");
          std::exit(1);
        }
        int64_t t1 = tide::bench::mono_ns();
        if (r >= warmup) {
          times[g].push_back(static_cast<double>(t1 - t0) / 1e9);
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  double store_cpu =
      (server.cpu_seconds() - cpu0) / static_cast<double>(warmup + rounds);
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
      store_cpu};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "quorum_bench: the per-step cost of tide.ft's quorum and commit");
  std::string groups_list = "2,8,64";
  size_t rounds = 300;
  app.add_option("--groups", groups_list, "simulated replica groups per cell");
  app.add_option("--rounds", rounds, "measured rounds per cell");
  CLI11_PARSE(app, argc, argv);

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
      "| groups | per group, median | p90 | slowest group, median | in round "
      "trips | store CPU per round |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  int job = 0;
  for (size_t n : tide::bench::parse_counts(groups_list)) {
    Cell c = run(server, n, rounds, job++);
    std::printf(
        "| %zu | %.3f ms | %.3f ms | %.3f ms | %.1f | %.3f ms |\n",
        n,
        c.median * 1e3,
        c.p90 * 1e3,
        c.slowest * 1e3,
        c.median / ref,
        c.store_cpu * 1e3);
    std::fflush(stdout);
  }
  return 0;
}
