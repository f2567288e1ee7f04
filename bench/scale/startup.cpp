#include "startup.h"

#include <algorithm>
#include <barrier>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "bench_util.h"
#include "sim.h"

namespace tide::bench::scale {

namespace {

constexpr const char* kCountKey = "init/count";
constexpr const char* kDoneKey = "init/done";

std::string addr_key(size_t rank) {
  return "init/addr/" + std::to_string(rank);
}

// Client `rank`'s address value: what a process group publishes (host:port),
// distinct per client.
std::string addr_value(size_t rank) {
  return fmt::format(
      "10.{}.{}.{}:29500", rank >> 16, (rank >> 8) & 255, rank & 255);
}

}  // namespace

sim::Co<void> start_up(
    StartupClient& c, size_t rank, size_t n, const StartupConfig& cfg) {
  co_await c.conn->connect();
  c.connected_at = mono_ns();
  co_await c.conn->set(addr_key(rank), addr_value(rank));
  int64_t in = co_await c.conn->add(kCountKey, 1);
  if (in == static_cast<int64_t>(n)) {
    co_await c.conn->set(kDoneKey, "1");
  }
  std::vector<std::string> done_key{kDoneKey};
  bool met = co_await c.conn->wait(std::move(done_key), cfg.timeout_ns);
  if (!met) {
    throw TimeoutError("the start-up barrier did not complete");
  }
  c.barrier_at = mono_ns();
  if (!cfg.fetch_all) {
    co_return;
  }
  for (size_t first = 0; first < n; first += cfg.batch) {
    std::vector<std::string> keys;
    for (size_t i = first; i < std::min(n, first + cfg.batch); ++i) {
      keys.push_back(addr_key(i));
    }
    auto values = co_await c.conn->multi_get(std::move(keys));
    if (values.back() != addr_value(first + values.size() - 1)) {
      throw ProtocolError("a peer's address came back wrong");
    }
  }
  c.fetched_at = mono_ns();
}

StartupResult run_startup(const StartupConfig& cfg, ServerProcess& server) {
  const size_t n = cfg.clients;
  const size_t threads = std::max<size_t>(1, std::min(cfg.threads, n));
  std::vector<StartupClient> clients(n);
  std::vector<std::string> errors(threads);
  std::vector<size_t> done(threads);
  std::vector<uint64_t> bytes(threads);
  // The threads hold their connections open until the main thread has read
  // the server's memory, then close them together.
  std::barrier measured(static_cast<std::ptrdiff_t>(threads + 1));

  StartupResult r;
  r.rss_before_kb = server.rss_kb();
  double cpu_before = server.cpu_seconds();
  int64_t start = mono_ns();
  int64_t deadline = start + cfg.timeout_ns;
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      sim::Loop loop;
      loop.set_connect_window(cfg.connect_window);
      size_t first = n * t / threads;
      size_t last = n * (t + 1) / threads;
      try {
        for (size_t i = first; i < last; ++i) {
          clients[i].conn = std::make_unique<sim::Conn>(
              loop,
              sim::ConnOptions{
                  .port = server.port(),
                  .source = sim::source_address(i, cfg.per_address),
                  .dialect = cfg.dialect,
                  .connect_timeout_ns = cfg.timeout_ns});
          loop.spawn(
              start_up(clients[i], i, n, cfg), [&, t](std::exception_ptr e) {
                if (e) {
                  if (errors[t].empty()) {
                    try {
                      std::rethrow_exception(e);
                    } catch (const std::exception& x) {
                      errors[t] = x.what();
                    }
                  }
                } else {
                  ++done[t];
                }
              });
        }
        if (!loop.run(deadline) && errors[t].empty()) {
          errors[t] = fmt::format(
              "not complete within {} s", cfg.timeout_ns / 1'000'000'000);
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
      for (size_t i = first; i < last; ++i) {
        bytes[t] += clients[i].conn->stats().bytes_out +
                    clients[i].conn->stats().bytes_in;
      }
      measured.arrive_and_wait();
      loop.begin_teardown();
      for (size_t i = first; i < last; ++i) {
        clients[i].conn.reset();
      }
    });
  }
  // Wait for the threads' loops (each bounded by the deadline), then measure.
  measured.arrive_and_wait();
  r.rss_after_kb = server.rss_kb();
  r.server_cpu_s = server.cpu_seconds() - cpu_before;
  for (auto& th : pool) {
    th.join();
  }

  for (size_t t = 0; t < threads; ++t) {
    r.done += done[t];
    r.bytes += bytes[t];
    if (!errors[t].empty() && r.error.empty()) {
      r.error = errors[t];
    }
  }
  int64_t connected = 0;
  int64_t barrier = 0;
  int64_t fetched = 0;
  for (const StartupClient& c : clients) {
    connected = std::max(connected, c.connected_at);
    barrier = std::max(barrier, c.barrier_at);
    fetched = std::max(fetched, c.fetched_at);
  }
  r.ok = r.done == n && r.error.empty();
  // NaN for a phase no client reached.
  auto since_start = [&](int64_t t) {
    return t > 0 ? static_cast<double>(t - start) / 1e9 : NAN;
  };
  r.connect_s = since_start(connected);
  r.barrier_s = since_start(barrier);
  r.fetch_s = cfg.fetch_all ? since_start(fetched) : 0;
  return r;
}

}  // namespace tide::bench::scale
