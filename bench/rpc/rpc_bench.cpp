// tide's side of the rpc benchmark (bench/rpc/run.sh runs it beside
// torch.distributed.rpc and the physical limits): two workers, rank 0
// drives and rank 1 serves.
//
//   sync_rtt_us        rpc_sync of a no-op taking one integer: round trips
//   async_calls_per_s  rpc_async no-ops with W in flight (W = 64, 256)
//   echo               rpc_sync of a float32 tensor returned as is (1 MiB,
//                      64 MiB): round trip, bytes each way per second
//                      (= tensor bytes / round trip, as torch's side)
//   echo_clone         the same, the server returning a copy (t.clone()):
//                      a returned input goes back to its owner's shared
//                      memory without a copy, a new tensor does not
//
// Without --rank it starts rank 1 itself (this binary again) on 127.0.0.1;
// with --rank each rank is started apart (run.sh puts them in two network
// namespaces). Prints one JSON object per figure on stdout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <semaphore>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tide/rpc/rpc.h"
#include "tide/rpc/tensor.h"

#include "bench_util.h"
#include "dist_autograd_bench.h"
#include "net/socket.h"

namespace {

using namespace std::chrono_literals;
using tide::rpc::RpcAgent;
namespace bench = tide::bench;

struct Args {
  int rank = -1;
  int world_size = 2;
  std::string init_method;
  std::string listen_host = "127.0.0.1";
  std::string transport = "auto";
  int tcp_lanes = tide::rpc::RpcBackendOptions{}.tcp_lanes;
  int calls = 5000;
  int warmup = 500;
};

void emit(const std::string& transport, const std::string& fields) {
  fmt::print(
      "{{\"impl\":\"tide\",\"transport\":\"{}\",{}}}\n", transport, fields);
  std::fflush(stdout);
}

void drive(RpcAgent& agent, const Args& a) {
  const std::string to = "worker1";
  for (int i = 0; i < a.warmup; ++i) {
    agent.rpc_sync<void>(to, "noop", int64_t{1});
  }
  // What the agent picked for this pair (shm or tcp).
  std::string kind = agent.transport_to(to);

  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(a.calls));
  for (int i = 0; i < a.calls; ++i) {
    int64_t t0 = bench::mono_ns();
    agent.rpc_sync<void>(to, "noop", int64_t{1});
    lat.push_back(static_cast<double>(bench::mono_ns() - t0) / 1e3);
  }
  emit(
      kind,
      fmt::format(
          "\"metric\":\"sync_rtt_us\",\"median\":{:.2f},\"p99\":{:.2f},"
          "\"n\":{}",
          bench::median(lat),
          bench::percentile(lat, 99),
          lat.size()));

  for (int window : {64, 256}) {
    int total = std::max(a.calls * 4, 20 * window);
    std::counting_semaphore<1024> slots(window);
    std::atomic<int> errors{0};
    int64_t t0 = bench::mono_ns();
    for (int i = 0; i < total; ++i) {
      slots.acquire();
      agent.rpc_async<void>(to, "noop", int64_t{1})
          .on_complete([&](const tide::Future<void>& f) {
            if (f.error()) {
              errors.fetch_add(1);
            }
            slots.release();
          });
    }
    for (int i = 0; i < window; ++i) {
      slots.acquire();
    }
    double seconds = static_cast<double>(bench::mono_ns() - t0) / 1e9;
    for (int i = 0; i < window; ++i) {
      slots.release();
    }
    emit(
        kind,
        fmt::format(
            "\"metric\":\"async_calls_per_s\",\"window\":{},\"value\":{:.0f},"
            "\"calls\":{},\"errors\":{}",
            window,
            total / seconds,
            total,
            errors.load()));
  }

  // echo returns the tensor it received; echo_clone a new one (a copy).
  for (std::string fn : {"echo", "echo_clone"}) {
    for (auto [mib, reps] : {std::pair{1, 200}, std::pair{64, 12}}) {
      at::Tensor t = at::rand({int64_t{mib} << 18});
      at::Tensor back;
      for (int i = 0; i < 3; ++i) {
        back = agent.rpc_sync<at::Tensor>(to, fn, t);
      }
      if (!at::equal(back, t)) {
        throw std::runtime_error("the echoed tensor differs from the one sent");
      }
      std::vector<double> rtt;
      for (int i = 0; i < reps; ++i) {
        int64_t t0 = bench::mono_ns();
        back = agent.rpc_sync<at::Tensor>(to, fn, t);
        rtt.push_back(static_cast<double>(bench::mono_ns() - t0) / 1e9);
      }
      double bytes = static_cast<double>(t.numel()) * 4;
      double med = bench::median(rtt);
      emit(
          kind,
          fmt::format(
              "\"metric\":\"{}\",\"size_bytes\":{:.0f},"
              "\"rtt_ms_median\":{:.3f},\"bytes_each_way_per_s\":{:.0f},"
              "\"n\":{}",
              fn,
              bytes,
              med * 1e3,
              bytes / med,
              reps));
    }
  }
}

// A value with a method, for RRef proxies.
struct Box {
  int64_t v = 0;
  int64_t get() const {
    return v;
  }
};

// Median and p99 of fn()'s wall time, in microseconds, as emit() fields.
template <typename F>
std::string timed_us(F fn, int calls, int warmup) {
  for (int i = 0; i < warmup; ++i) {
    fn();
  }
  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(calls));
  for (int i = 0; i < calls; ++i) {
    int64_t t0 = bench::mono_ns();
    fn();
    lat.push_back(static_cast<double>(bench::mono_ns() - t0) / 1e3);
  }
  return fmt::format(
      "\"median\":{:.2f},\"p99\":{:.2f},\"n\":{}",
      bench::median(lat),
      bench::percentile(lat, 99),
      lat.size());
}

// remote()+to_here(), a proxy call, and an RRef passed user -> user (to
// this rank itself: a fork request to the owner, then the child's accept).
void drive_rrefs(RpcAgent& agent, const Args& a) {
  const std::string to = "worker1";
  const std::string kind = agent.transport_to(to);
  int calls = std::max(a.calls / 5, 1);
  int warmup = std::max(a.warmup / 5, 1);
  emit(
      kind,
      "\"metric\":\"remote_to_here_us\"," +
          timed_us(
              [&] { agent.remote<int64_t>(to, "value", int64_t{1}).to_here(); },
              calls,
              warmup));
  auto box = agent.remote<Box>(to, "make_box", int64_t{1});
  emit(
      kind,
      "\"metric\":\"proxy_rtt_us\"," +
          timed_us(
              [&] { box.rpc_sync().call<int64_t>("get"); }, calls, warmup));
  auto held = agent.remote<int64_t>(to, "value", int64_t{1});
  held.to_here();
  const std::string me = agent.get_worker_info().name;
  emit(
      kind,
      "\"metric\":\"rref_pass_us\"," +
          timed_us(
              [&] { agent.rpc_sync<void>(me, "take_rref", held); },
              calls,
              warmup));
}

int run_rank(const Args& a) {
  at::set_num_threads(1);  // as torch's side: the two ranks share the cores
  tide::rpc::RpcBackendOptions o;
  o.init_method = a.init_method;
  o.listen_host = a.listen_host;
  o.rpc_timeout = 120s;
  o.tcp_lanes = a.tcp_lanes;
  if (a.transport == "tcp") {
    o.transports = {"tcp"};
  }
  RpcAgent agent("worker" + std::to_string(a.rank), a.rank, a.world_size, o);
  if (a.rank == 0) {
    drive(agent, a);
    drive_rrefs(agent, a);
    const std::string kind = agent.transport_to("worker1");
    bench::drive_dist_autograd(
        agent,
        std::max(a.calls / 25, 1),
        std::max(a.warmup / 25, 1),
        16,
        64,
        [&kind](const std::string& fields) { emit(kind, fields); });
  }
  agent.shutdown(true);
  return 0;
}

// Registered for the whole process before any agent exists, so the server
// has them when the first call comes.
TIDE_RPC_FUNCTION(noop, [](int64_t) {});
TIDE_RPC_FUNCTION(echo, [](at::Tensor t) { return t; });
TIDE_RPC_FUNCTION(echo_clone, [](at::Tensor t) { return t.clone(); });
TIDE_RPC_FUNCTION(value, [](int64_t v) { return v; });
TIDE_RPC_FUNCTION(make_box, [](int64_t v) { return Box{v}; });
TIDE_RPC_FUNCTION(take_rref, [](tide::rpc::RRef<int64_t>) {});
TIDE_RPC_METHOD(Box, get, &Box::get);

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"tide rpc benchmark: rank 0 drives, rank 1 serves"};
  app.add_option("--rank", a.rank, "this worker's rank (default: both, here)");
  app.add_option("--world-size", a.world_size);
  app.add_option("--init-method", a.init_method, "tcp://host:port");
  app.add_option("--listen-host", a.listen_host);
  app.add_option(
      "--tcp-lanes",
      a.tcp_lanes,
      "RpcBackendOptions::tcp_lanes: TCP connections a large tensor is cut "
      "over, beside the first (0: none)");
  app.add_option("--transport", a.transport, "auto (shm on one host) or tcp")
      ->check(CLI::IsMember({"auto", "tcp"}));
  app.add_option("--calls", a.calls);
  app.add_option("--warmup", a.warmup);
  CLI11_PARSE(app, argc, argv);
  try {
    if (a.rank >= 0) {
      if (a.init_method.empty()) {
        throw std::invalid_argument("--rank needs --init-method");
      }
      return run_rank(a);
    }
    a.init_method =
        "tcp://127.0.0.1:" + std::to_string(tide::net::free_port("127.0.0.1"));
    bench::Child server(
        {"/proc/self/exe",
         "--rank",
         "1",
         "--init-method",
         a.init_method,
         "--transport",
         a.transport,
         "--tcp-lanes",
         std::to_string(a.tcp_lanes)},
        {.name = "rpc_bench rank 1"});
    a.rank = 0;
    int rc = run_rank(a);
    if (!server.wait_until(bench::deadline_after(60)) || server.status() != 0) {
      throw std::runtime_error("rank 1 did not exit cleanly");
    }
    return rc;
  } catch (const std::exception& e) {
    fmt::print(stderr, "rpc_bench: {}\n", e.what());
    return 1;
  }
}
