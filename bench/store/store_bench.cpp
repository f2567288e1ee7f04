// store_bench: store operations per second with 1, 16, 256... concurrent
// clients, against tide's store server (apps/tide-store) and torch's TCPStore
// server (bench/peers/torch_store_server.py, Debian's python3-torch: 1.13, or
// 2.6 in Debian 13), in one run. Both servers run as child processes for the
// whole run and are driven by the same load generator in the dialect of that
// torch (--dialect auto: legacy for 1.13 through 2.1, modern since 2.2), so
// only the server differs.
//
// A cell (cell.h) is (driver, workload, clients, server). Every cell runs
// --reps times, the two servers alternating which goes first, and the report
// gives medians, the ratio tide/torch, and lines starting with RESULT for
// scripts. docs/benchmarks.md has the figures and the command that made them.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_util.h"
#include "cell.h"
#include "server_process.h"

namespace tide::bench {
namespace {

using std::chrono::milliseconds;

// How long a server may take to print its port (torch's import is slow).
constexpr milliseconds kServerStartTimeout{120'000};

// The reps of one (driver, workload, clients, server).
struct Series {
  std::vector<double> ops_per_s;  // Reps without failed clients only.
  std::vector<double> server_cores;
  std::vector<double> client_cores;
  // Server CPU time per op: its cost, whichever side limits the rate.
  std::vector<double> server_us_per_op;
  // ops/s by rep, for ratios of the two servers' back-to-back cells.
  std::map<int, double> by_rep;
  int failed_reps = 0;
};

std::string fmt_rate(double v) {
  return std::isnan(v) ? std::string("-") : fmt::format("{:.0f}", v);
}

// This executable's directory, for defaults relative to it.
std::filesystem::path exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : p.parent_path();
}

std::string first_existing(const std::vector<std::filesystem::path>& paths) {
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) {
      return p.lexically_normal().string();
    }
  }
  return paths.front().string();
}

// Raises the soft descriptor limit to the hard one (the servers inherit it):
// every client holds a socket here and one in the server.
void raise_fd_limit(int clients) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return;
  }
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < static_cast<rlim_t>(clients) + 64) {
    throw std::invalid_argument(fmt::format(
        "{} clients need more descriptors than RLIMIT_NOFILE allows ({}); "
        "raise it (ulimit -n) or use fewer clients",
        clients,
        static_cast<unsigned long long>(rl.rlim_cur)));
  }
}

struct Options {
  std::vector<int> clients = {1, 16, 256};
  double seconds = 2;
  double warmup = 0.5;
  int reps = 5;
  double op_timeout_s = 30;
  std::vector<std::string> drivers = {"threads", "epoll"};
  int epoll_threads = 1;
  std::vector<std::string> workloads = {"mix"};
  std::vector<std::string> servers = {"tide", "torch"};
  std::string tide_store;
  std::string python = "/usr/bin/python3";
  std::string torch_peer;
  std::string dialect = "auto";
};

// The dialect torch `version` speaks: modern since 2.2.
store::Dialect dialect_of_torch(const std::string& version) {
  int major = 0;
  int minor = 0;
  std::sscanf(version.c_str(), "%d.%d", &major, &minor);
  return major > 2 || (major == 2 && minor >= 2) ? store::Dialect::kModern
                                                 : store::Dialect::kLegacy;
}

const char* dialect_name(store::Dialect d) {
  return d == store::Dialect::kModern ? "modern (torch >= 2.2)"
                                      : "legacy (torch 1.13 through 2.1)";
}

// results[driver][workload][clients][server]
using Results = std::map<
    std::string,
    std::map<std::string, std::map<int, std::map<std::string, Series>>>>;

// tide's ops/s over torch's: the ratio of the medians, and the median of
// the reps' own ratios (the two cells of a rep run back to back, so that one
// shrugs off slow drifts in the machine's load). NaN when not measured.
struct Ratios {
  double of_medians = NAN;
  double paired = NAN;
};

Ratios ratios(const Series& tide, const Series& torch) {
  Ratios r;
  r.of_medians = median(tide.ops_per_s) / median(torch.ops_per_s);
  std::vector<double> paired;
  for (const auto& [rep, v] : tide.by_rep) {
    auto it = torch.by_rep.find(rep);
    if (it != torch.by_rep.end() && it->second > 0) {
      paired.push_back(v / it->second);
    }
  }
  r.paired = median(paired);
  return r;
}

std::string fmt_ratio(double v) {
  return std::isfinite(v) ? fmt::format("{:.2f}", v) : std::string("-");
}

void print_table(
    const Options& o, std::map<int, std::map<std::string, Series>>& rows) {
  std::printf(
      "| clients | tide ops/s (median) | torch ops/s (median) | ratio | "
      "paired ratio | tide min-max | torch min-max | server us/op, tide / "
      "torch | cores, tide server / clients | cores, torch server / clients "
      "|\n"
      "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (int n : o.clients) {
    auto& row = rows[n];
    auto med = [&](const std::string& server) {
      const Series& s = row[server];
      std::string v = fmt_rate(median(s.ops_per_s));
      if (s.failed_reps > 0) {
        v += fmt::format(" ({} reps failed)", s.failed_reps);
      }
      return v;
    };
    auto range = [&](const std::string& server) -> std::string {
      const Series& s = row[server];
      if (s.ops_per_s.empty()) {
        return "-";
      }
      auto [lo, hi] =
          std::minmax_element(s.ops_per_s.begin(), s.ops_per_s.end());
      return fmt_rate(*lo) + "-" + fmt_rate(*hi);
    };
    auto us = [&](const std::string& server) {
      double v = median(row[server].server_us_per_op);
      return std::isfinite(v) ? fmt::format("{:.1f}", v) : std::string("-");
    };
    auto cores = [&](const std::string& server) -> std::string {
      const Series& s = row[server];
      if (s.ops_per_s.empty()) {
        return "-";
      }
      return fmt::format(
          "{:.2f} / {:.2f}", median(s.server_cores), median(s.client_cores));
    };
    Ratios r = ratios(row["tide"], row["torch"]);
    std::printf(
        "| %d | %s | %s | %s | %s | %s | %s | %s / %s | %s | %s |\n",
        n,
        med("tide").c_str(),
        med("torch").c_str(),
        fmt_ratio(r.of_medians).c_str(),
        fmt_ratio(r.paired).c_str(),
        range("tide").c_str(),
        range("torch").c_str(),
        us("tide").c_str(),
        us("torch").c_str(),
        cores("tide").c_str(),
        cores("torch").c_str());
  }
}

void print_report(const Options& o, store::Dialect d, Results& results) {
  std::printf(
      "\nAll traffic over 127.0.0.1, the %s protocol. %.1f s measured "
      "after %.1f s warm-up per cell, %d reps, the servers alternating which "
      "goes first. ratio: of the medians; paired ratio: median of the reps' "
      "own ratios. get is WAIT + GET (two round trips), as torch's client "
      "does; set has no reply in this protocol. server us/op: server CPU time "
      "per op. cores: CPU time over the window, server process / this "
      "process (the clients).\n",
      dialect_name(d),
      o.seconds,
      o.warmup,
      o.reps);
  for (const auto& dname : o.drivers) {
    for (const auto& wname : o.workloads) {
      std::printf(
          "\nDriver %s: %s.\nWorkload %s: %s.\n\n",
          dname.c_str(),
          describe(parse_driver(dname)),
          wname.c_str(),
          describe(parse_workload(wname)));
      print_table(o, results[dname][wname]);
    }
  }
  std::printf("\n");
  for (const auto& dname : o.drivers) {
    for (const auto& wname : o.workloads) {
      for (int n : o.clients) {
        auto& row = results[dname][wname][n];
        for (const auto& server : o.servers) {
          const Series& s = row[server];
          std::vector<std::string> values;
          for (double v : s.ops_per_s) {
            values.push_back(fmt::format("{:.0f}", v));
          }
          std::printf(
              "RESULT store driver=%s workload=%s clients=%d server=%s "
              "ops_per_s=%s reps=%zu failed_reps=%d server_cores=%.2f "
              "client_cores=%.2f server_us_per_op=%.2f values=%s\n",
              dname.c_str(),
              wname.c_str(),
              n,
              server.c_str(),
              fmt_rate(median(s.ops_per_s)).c_str(),
              s.ops_per_s.size(),
              s.failed_reps,
              median(s.server_cores),
              median(s.client_cores),
              median(s.server_us_per_op),
              values.empty() ? "-" : join(values, ",").c_str());
        }
        Ratios r = ratios(row["tide"], row["torch"]);
        if (std::isfinite(r.of_medians)) {
          std::printf(
              "RESULT store driver=%s workload=%s clients=%d ratio=%.2f "
              "paired_ratio=%.2f\n",
              dname.c_str(),
              wname.c_str(),
              n,
              r.of_medians,
              r.paired);
        }
      }
    }
  }
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  Options o;
  o.tide_store =
      first_existing({TIDE_BENCH_TIDE_STORE, exe_dir() / "../apps/tide-store"});
  o.torch_peer = first_existing(
      {TIDE_BENCH_TORCH_PEER,
       exe_dir() / "../../bench/peers/torch_store_server.py"});

  CLI::App app{
      "store_bench: store ops/s with N concurrent clients against tide-store "
      "and torch's TCPStore server, in one run"};
  app.add_option("--clients", o.clients, "client counts, a cell each")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seconds", o.seconds, "measured seconds per cell")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "unmeasured seconds before each window")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--reps", o.reps, "repetitions of every cell")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--drivers",
         o.drivers,
         "threads (a TcpStore and a thread per client), epoll (N connections "
         "in few threads)")
      ->delimiter(',')
      ->check(CLI::IsMember({"threads", "epoll"}))
      ->capture_default_str();
  app.add_option(
         "--epoll-threads", o.epoll_threads, "threads of the epoll driver")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--workloads",
         o.workloads,
         "mix (set, get, add in rotation), set, get, add")
      ->delimiter(',')
      ->check(CLI::IsMember({"mix", "set", "get", "add"}))
      ->capture_default_str();
  app.add_option("--servers", o.servers, "tide, torch")
      ->delimiter(',')
      ->check(CLI::IsMember({"tide", "torch"}))
      ->capture_default_str();
  app.add_option("--tide-store", o.tide_store, "the tide-store executable")
      ->capture_default_str();
  app.add_option("--python", o.python, "a python3 with torch (python3-torch)")
      ->capture_default_str();
  app.add_option("--torch-peer", o.torch_peer, "torch_store_server.py")
      ->capture_default_str();
  app.add_option(
         "--dialect",
         o.dialect,
         "what the clients speak: legacy, modern, or auto (that of --python's "
         "torch)")
      ->check(CLI::IsMember({"auto", "legacy", "modern"}))
      ->capture_default_str();
  app.add_option(
         "--op-timeout",
         o.op_timeout_s,
         "seconds any one client call may take before the cell fails")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto dedup = [](std::vector<std::string>& v) {
    std::vector<std::string> out;
    for (auto& s : v) {
      if (std::find(out.begin(), out.end(), s) == out.end()) {
        out.push_back(s);
      }
    }
    v = std::move(out);
  };
  dedup(o.drivers);
  dedup(o.workloads);
  dedup(o.servers);
  raise_fd_limit(*std::max_element(o.clients.begin(), o.clients.end()));

  std::string build_type = TIDE_BENCH_BUILD_TYPE;
  std::string sanitize = TIDE_BENCH_SANITIZE;  // A cache string: may be OFF.
  bool sanitized = sanitize == "address" || sanitize == "thread";
  if (sanitized ||
      (build_type != "Release" && build_type != "RelWithDebInfo")) {
    std::fprintf(
        stderr,
        "store_bench: WARNING: built as %s%s%s: tide-store and the client "
        "library are not optimised, so the figures mean little. Use "
        "bench/store/run.sh (a Release build).\n",
        build_type.c_str(),
        sanitized ? " with sanitizer " : "",
        sanitized ? sanitize.c_str() : "");
  }

  store::Dialect dialect =
      o.dialect == "modern" ? store::Dialect::kModern : store::Dialect::kLegacy;
  if (o.dialect == "auto") {
    std::string version = first_line_of(
        {o.python, "-c", "import torch; print(torch.__version__)"}, 120);
    if (version.empty()) {
      std::fprintf(
          stderr,
          "store_bench: %s could not tell torch's version: give --dialect\n",
          o.python.c_str());
      return 2;
    }
    dialect = dialect_of_torch(version);
    std::fprintf(
        stderr,
        "store_bench: torch %s: the clients speak the %s dialect\n",
        version.c_str(),
        dialect_name(dialect));
  }

  std::vector<std::string> cmdline(argv, argv + argc);
  std::printf("# %s\n", join(cmdline, " ").c_str());
  std::printf(
      "# %s, %u cpus, %s build, load average %s\n",
      now_utc().c_str(),
      std::thread::hardware_concurrency(),
      build_type.c_str(),
      load_average().c_str());
  std::fflush(stdout);

  // Both servers stay up for the whole run; every cell opens new
  // connections (and uses the same keys, so the stores do not grow).
  std::map<std::string, std::unique_ptr<ServerProcess>> servers;
  for (const auto& name : o.servers) {
    std::fprintf(stderr, "store_bench: starting the %s server\n", name.c_str());
    if (name == "tide") {
      servers[name] = std::make_unique<ServerProcess>(
          "tide-store",
          std::vector<std::string>{
              o.tide_store, "--host", "127.0.0.1", "--port", "0"},
          kServerStartTimeout);
    } else {
      servers[name] = std::make_unique<ServerProcess>(
          "torch TCPStore",
          std::vector<std::string>{
              o.python, o.torch_peer, "--host", "127.0.0.1", "--port", "0"},
          kServerStartTimeout);
    }
    std::fprintf(
        stderr,
        "store_bench: %s listening on 127.0.0.1:%u\n",
        servers[name]->name().c_str(),
        servers[name]->port());
  }

  Results results;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (const auto& dname : o.drivers) {
      for (const auto& wname : o.workloads) {
        for (int n : o.clients) {
          // Alternate which server goes first, to spread slow drifts.
          std::vector<std::string> order = o.servers;
          if (rep % 2 == 1) {
            std::reverse(order.begin(), order.end());
          }
          for (const auto& server : order) {
            CellConfig cfg{
                .driver = parse_driver(dname),
                .workload = parse_workload(wname),
                .dialect = dialect,
                .clients = n,
                .epoll_threads = o.epoll_threads,
                .warmup = Seconds(o.warmup),
                .measure = Seconds(o.seconds),
                .op_timeout =
                    milliseconds(static_cast<int64_t>(o.op_timeout_s * 1000))};
            CellResult r = run_cell(cfg, *servers[server], interrupt_flag());
            throw_if_interrupted();
            Series& s = results[dname][wname][n][server];
            if (r.failed_clients > 0) {
              ++s.failed_reps;
              std::fprintf(
                  stderr,
                  "store_bench: rep %d %s %s clients=%d %s: %d clients "
                  "failed; the first: %s\n",
                  rep + 1,
                  dname.c_str(),
                  wname.c_str(),
                  n,
                  server.c_str(),
                  r.failed_clients,
                  r.first_error.c_str());
            } else {
              s.ops_per_s.push_back(r.ops_per_s);
              s.by_rep[rep] = r.ops_per_s;
              s.server_cores.push_back(r.server_cores);
              s.client_cores.push_back(r.client_cores);
              s.server_us_per_op.push_back(
                  r.ops_per_s > 0 ? r.server_cores / r.ops_per_s * 1e6 : NAN);
            }
            std::fprintf(
                stderr,
                "store_bench: rep %d/%d %s %s clients=%d %s: %.0f ops/s "
                "(cores: server %.2f, clients %.2f)\n",
                rep + 1,
                o.reps,
                dname.c_str(),
                wname.c_str(),
                n,
                server.c_str(),
                r.ops_per_s,
                r.server_cores,
                r.client_cores);
          }
        }
      }
    }
  }
  for (auto& [_, server] : servers) {
    server->stop();
  }
  std::printf(
      "# done %s, load average %s\n",
      now_utc().c_str(),
      load_average().c_str());
  print_report(o, dialect, results);
  return 0;
}

}  // namespace
}  // namespace tide::bench

int main(int argc, char** argv) {
  // A server that dies mid-write must not kill the load generator.
  ::signal(SIGPIPE, SIG_IGN);
  // SIGINT and SIGTERM go to a thread that asks the run to stop, so the
  // servers are stopped and reaped on the way out. Blocked before any other
  // thread starts, so that every thread inherits the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    timespec tick{.tv_sec = 0, .tv_nsec = 200'000'000};
    while (!done.load()) {
      if (::sigtimedwait(&stop, nullptr, &tick) > 0) {
        tide::bench::interrupt_flag() = true;
      }
    }
  });
  int rc = 0;
  try {
    rc = tide::bench::run(argc, argv);
  } catch (const tide::bench::Interrupted&) {
    std::fprintf(stderr, "store_bench: interrupted; servers stopped\n");
    rc = 130;
  } catch (const std::exception& e) {
    if (tide::bench::interrupted()) {
      // A terminal's ^C reaches the servers too: their exit is no error.
      std::fprintf(stderr, "store_bench: interrupted; servers stopped\n");
      rc = 130;
    } else {
      std::fprintf(stderr, "store_bench: %s\n", e.what());
      rc = 1;
    }
  }
  done = true;
  watcher.join();
  return rc;
}
