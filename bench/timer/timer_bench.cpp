// timer_bench: tide's expiration timers against torch's FileTimerServer and
// FileTimerClient (Debian's python3-torch 1.13.1, through
// bench/peers/timer_peer.py), in one run on one machine:
//
//   throughput  acquire+release pairs per second from 1 and 8 client
//               processes against one server, each doing N pairs from a
//               common start signal, until the server has applied every
//               request (end to end: the server's work counts, not only the
//               clients' writes);
//   expiry      expiry-to-kill latency: after a random pause of up to
//               max_interval (so that timers are armed at random points of
//               torch's polling cycle, not in step with the previous kill), a
//               child arms a SIGKILL timer expiring --after s ahead and
//               sleeps; the bench sees it die on a pidfd. Latency = death
//               observed - expiration time (both system clock, as torch's
//               time.time()). At max_interval 0.1 and 1.0: tide's server
//               wakes at the next deadline, torch's polls every max_interval.
//
// tide's server runs in this process; its clients are this binary started
// again in a client mode (--timer-bench-client, --timer-bench-expire). Both
// servers use max_interval 0.1 s (torchrun's agent's) for throughput. The
// LocalTimerServer (Unix datagram socket) rows have no torch counterpart.
// Cases alternate: each case runs tide's side, then torch's. The report is a
// markdown table of medians and ratios, and lines starting with RESULT.
// docs/benchmarks.md has the figures and the command that made them.
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL), every wait a deadline, and a
// child still running when its case ends (or fails) is killed and reaped.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"
#include "tide/timer/timer.h"
#include "tide/timer/timer_server.h"

#include "bench_util.h"

namespace tide::bench {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kClientMode = "--timer-bench-client";
constexpr std::string_view kExpireMode = "--timer-bench-expire";
// Longest the bench waits on its condition variable before looking at the
// interrupt flag.
constexpr int kPollSliceMs = 100;

double parse_double(std::string_view text, std::string_view what) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    throw std::runtime_error(
        fmt::format("bad {}: \"{}\"", what, std::string(text)));
  }
  return v;
}

// ---------------------------------------------------------------------------
// Client modes (run in child processes).

std::unique_ptr<timer::TimerClient> make_client(
    std::string_view kind, const std::string& path) {
  if (kind == "file") {
    // Kept open between requests: tide's server allows it (torch's does not).
    return std::make_unique<timer::FileTimerClient>(
        path, SIGKILL, std::chrono::seconds(10), /*keep_open=*/true);
  }
  if (kind == "local") {
    return std::make_unique<timer::LocalTimerClient>(path, SIGKILL);
  }
  throw std::runtime_error(
      fmt::format("unknown timer kind {}", std::string(kind)));
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      throw std::runtime_error(errno_text("write", errno));
    }
    done += static_cast<size_t>(n);
  }
}

// Blocks until stdin reaches end of file: the bench's start signal.
void wait_for_start(double timeout_s) {
  int64_t deadline = deadline_after(timeout_s);
  char c;
  for (;;) {
    if (!poll_until(0, POLLIN, deadline)) {
      throw std::runtime_error("no start signal");
    }
    ssize_t n = ::read(0, &c, 1);
    if (n == 0) {
      return;
    }
    if (n < 0 && errno != EINTR) {
      throw std::runtime_error(errno_text("read(stdin)", errno));
    }
  }
}

// timer_bench --timer-bench-client KIND PATH PAIRS TIMEOUT_S
// Prints "ready", waits for the start signal, does PAIRS acquire+release
// pairs, prints "done SECONDS".
int client_main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s KIND PATH PAIRS TIMEOUT_S\n", argv[1]);
    return 2;
  }
  auto client = make_client(argv[2], argv[3]);
  long pairs = std::stol(argv[4]);
  double timeout_s = parse_double(argv[5], "timeout");
  write_all(1, "ready\n");
  wait_for_start(timeout_s);
  const std::string scope = "s";
  int64_t t0 = mono_ns();
  for (long i = 0; i < pairs; ++i) {
    client->acquire(scope, timer::now() + 60);
    client->release(scope);
  }
  double seconds = static_cast<double>(mono_ns() - t0) * 1e-9;
  write_all(1, fmt::format("done {:.9f}\n", seconds));
  return 0;
}

// timer_bench --timer-bench-expire KIND PATH AFTER_S TIMEOUT_S
// Waits for the start signal, arms a SIGKILL timer expiring AFTER_S ahead,
// prints its expiration time, sleeps TIMEOUT_S and exits 3 (if alive).
int expire_main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s KIND PATH AFTER_S TIMEOUT_S\n", argv[1]);
    return 2;
  }
  auto client = make_client(argv[2], argv[3]);
  double after = parse_double(argv[4], "after");
  double timeout_s = parse_double(argv[5], "timeout");
  wait_for_start(timeout_s);
  // The FIFO carries microseconds (%.6f): arm and report the same value.
  double expiration = std::round((timer::now() + after) * 1e6) / 1e6;
  client->acquire("expiring", expiration);
  write_all(1, fmt::format("{:.6f}\n", expiration));
  std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s));
  return 3;
}

// ---------------------------------------------------------------------------
// The bench.

struct Options {
  std::string python = "/usr/bin/python3";
  std::string peer = TIDE_BENCH_TIMER_PEER;
  std::string cases = "throughput,expiry";
  std::string sides = "tide,torch";
  std::string clients = "1,8";
  std::string intervals = "0.1,1.0";
  // Pairs per client and run.
  long tide_pairs = 50'000;
  long torch_pairs = 10'000;
  int reps = 3;
  int expiry_reps = 10;
  double after_s = 0.05;
  double throughput_interval_s = 0.1;
  bool local = true;
  double timeout_s = 120;
};

std::string self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    throw std::runtime_error("cannot read /proc/self/exe: " + ec.message());
  }
  return p.string();
}

std::vector<double> split_doubles(const std::string& list) {
  std::vector<double> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) {
      out.push_back(parse_double(item, "list item"));
    }
  }
  return out;
}

bool contains(const std::string& list, std::string_view item) {
  std::stringstream ss(list);
  for (std::string x; std::getline(ss, x, ',');) {
    if (x == item) {
      return true;
    }
  }
  return false;
}

// The key=value fields of a RESULT line.
std::map<std::string, std::string> fields(std::string_view line) {
  std::map<std::string, std::string> out;
  std::stringstream ss{std::string(line)};
  for (std::string tok; ss >> tok;) {
    if (auto eq = tok.find('='); eq != std::string::npos) {
      out[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
  }
  return out;
}

// Pids a server may signal: the bench's children (as the agent allows only
// its workers).
class PidSet {
 public:
  void add(pid_t pid) {
    std::lock_guard lock(mutex_);
    pids_.insert(pid);
  }
  bool has(pid_t pid) const {
    std::lock_guard lock(mutex_);
    return pids_.count(pid) > 0;
  }

 private:
  mutable std::mutex mutex_;
  std::set<pid_t> pids_;
};

std::unique_ptr<timer::TimerServer> make_server(
    std::string_view kind,
    const std::string& path,
    timer::TimerServerOptions options) {
  if (kind == "file") {
    return std::make_unique<timer::FileTimerServer>(path, std::move(options));
  }
  return std::make_unique<timer::LocalTimerServer>(path, std::move(options));
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(std::lround(seconds * 1000));
}

// One end-to-end throughput run of tide's server `kind` with `clients`
// client processes doing `pairs` pairs each. Returns RESULT fields.
std::map<std::string, double> tide_throughput_run(
    const Options& o, std::string_view kind, int clients, long pairs) {
  ScratchDir scratch("timer_bench");
  std::string path = (scratch.path() / "timer").string();
  long per_client = pairs;
  uint64_t target = 2 * static_cast<uint64_t>(per_client) * clients;

  // Counts applied requests on the watchdog thread; stamps the last.
  struct Progress {
    std::atomic<uint64_t> applied{0};
    std::mutex mutex;
    std::condition_variable cv;
    int64_t done_ns = 0;  // Guarded by mutex.
  } progress;
  PidSet pids;
  auto server = make_server(
      kind,
      path,
      timer::TimerServerOptions{
          .max_interval = to_ms(o.throughput_interval_s),
          .allow_pid = [&pids](pid_t pid) { return pids.has(pid); },
          .log_event =
              [&progress, target](
                  const std::string& event, const timer::TimerRequest&) {
                if (event != "set timer" && event != "clear timer") {
                  return;
                }
                if (progress.applied.fetch_add(1) + 1 == target) {
                  int64_t t = mono_ns();
                  {
                    std::lock_guard lock(progress.mutex);
                    progress.done_ns = t;
                  }
                  progress.cv.notify_all();
                }
              },
      });
  server->start();

  std::string exe = self_exe();
  std::vector<std::unique_ptr<Child>> procs;
  std::vector<LineReader> readers;
  int64_t deadline = deadline_after(o.timeout_s);
  for (int i = 0; i < clients; ++i) {
    procs.push_back(std::make_unique<Child>(
        std::vector<std::string>{
            exe,
            std::string(kClientMode),
            std::string(kind),
            path,
            std::to_string(per_client),
            fmt::format("{}", o.timeout_s)},
        ChildOptions{.pipes = true}));
    pids.add(procs.back()->pid());
    readers.emplace_back(procs.back()->out());
  }
  for (auto& r : readers) {
    auto line = r.next(deadline, "a client to start");
    if (line != "ready") {
      throw std::runtime_error("a client failed to start");
    }
  }
  int64_t t0 = mono_ns();
  for (auto& p : procs) {
    p->close_in();
  }
  int64_t done_ns = 0;
  {
    std::unique_lock lock(progress.mutex);
    while (progress.done_ns == 0) {
      throw_if_interrupted();
      if (mono_ns() > deadline) {
        throw std::runtime_error(fmt::format(
            "the server applied {} of {} requests in {} s",
            progress.applied.load(),
            target,
            o.timeout_s));
      }
      progress.cv.wait_for(lock, std::chrono::milliseconds(kPollSliceMs));
    }
    done_ns = progress.done_ns;
  }
  double client_s = 0;
  for (size_t i = 0; i < procs.size(); ++i) {
    auto line = readers[i].next(deadline, "a client's report");
    if (!line || !line->starts_with("done ")) {
      throw std::runtime_error("a client did not report");
    }
    client_s = std::max(client_s, parse_double(line->substr(5), "seconds"));
    if (!procs[i]->wait_until(deadline)) {
      throw std::runtime_error("a client did not exit");
    }
    if (procs[i]->status() != 0) {
      throw std::runtime_error(
          "a client failed: " + describe_status(procs[i]->status()));
    }
  }
  server->stop();
  double seconds = static_cast<double>(done_ns - t0) * 1e-9;
  double total = static_cast<double>(per_client) * clients;
  return {
      {"pairs", total},
      {"seconds", seconds},
      {"pairs_per_s", total / seconds},
      {"client_pairs_per_s", total / client_s},
  };
}

// tide's expiry-to-kill latencies (seconds), one per rep.
std::vector<double> tide_expiry(
    const Options& o, std::string_view kind, double max_interval) {
  ScratchDir scratch("timer_bench");
  std::string path = (scratch.path() / "timer").string();
  PidSet pids;
  auto server = make_server(
      kind,
      path,
      timer::TimerServerOptions{
          .max_interval = to_ms(max_interval),
          .allow_pid = [&pids](pid_t pid) { return pids.has(pid); },
      });
  server->start();
  std::string exe = self_exe();
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> pause(0, max_interval);
  std::vector<double> lats;
  for (int rep = 0; rep < o.expiry_reps; ++rep) {
    Child child(
        {exe,
         std::string(kExpireMode),
         std::string(kind),
         path,
         fmt::format("{}", o.after_s),
         fmt::format("{}", o.timeout_s)},
        ChildOptions{.pipes = true});
    pids.add(child.pid());
    std::this_thread::sleep_for(std::chrono::duration<double>(pause(rng)));
    throw_if_interrupted();
    child.close_in();
    LineReader reader(child.out());
    auto line = reader.next(deadline_after(o.timeout_s), "the expiration");
    if (!line) {
      throw std::runtime_error(
          "the expiring child failed before arming its timer");
    }
    double expiration = parse_double(*line, "expiration");
    bool died = child.wait_until(
        deadline_after(o.after_s + max_interval + std::min(o.timeout_s, 30.0)));
    if (!died) {
      throw std::runtime_error("the expiring child outlived its timer");
    }
    if (!WIFSIGNALED(child.status()) || WTERMSIG(child.status()) != SIGKILL) {
      throw std::runtime_error(
          "the expiring child was not killed by its timer: " +
          describe_status(child.status()));
    }
    double lat = child.exit_wall_s() - expiration;
    lats.push_back(lat);
    fmt::print(
        "RESULT tide expiry kind={} max_interval={} rep={} latency_s={:.6f}\n",
        kind,
        max_interval,
        rep,
        lat);
    std::fflush(stdout);
  }
  return lats;
}

// Runs the torch peer with `args`; returns its RESULT lines' fields (the
// lines are echoed).
std::vector<std::map<std::string, std::string>> run_peer(
    const Options& o, const std::vector<std::string>& args) {
  // Its FIFOs go here, so that nothing is left behind if it is killed.
  ScratchDir scratch("timer_bench");
  std::vector<std::string> argv{o.python, o.peer};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(fmt::format("--timeout={}", o.timeout_s));
  argv.push_back("--workdir=" + scratch.path().string());
  Child peer(argv, ChildOptions{.pipes = true, .own_group = true});
  peer.close_in();
  LineReader reader(peer.out());
  // Room for torch's import and the runs, each bounded by --timeout.
  int64_t deadline = deadline_after(3 * o.timeout_s);
  std::vector<std::map<std::string, std::string>> out;
  while (auto line = reader.next(deadline, "the torch peer")) {
    if (line->starts_with("RESULT ")) {
      fmt::print("{}\n", *line);
      std::fflush(stdout);
      out.push_back(fields(*line));
    }
  }
  if (!peer.wait_until(deadline)) {
    throw std::runtime_error("the torch peer did not exit");
  }
  if (peer.status() != 0) {
    throw std::runtime_error(
        "the torch peer failed: " + describe_status(peer.status()));
  }
  return out;
}

// A row of the report: medians of tide's and torch's runs.
struct Row {
  std::string label;
  bool is_rate = true;  // Else a latency in seconds.
  std::vector<double> tide;
  std::vector<double> torch;
  std::string error;
};

std::string format_value(bool is_rate, double v) {
  if (std::isnan(v)) {
    return "-";
  }
  if (is_rate) {
    return v >= 1e5 ? fmt::format("{:.0f}k", v / 1e3)
                    : fmt::format("{:.1f}k", v / 1e3);
  }
  return format_duration(v, 2);
}

std::string format_range(bool is_rate, const Stats& s) {
  if (s.n == 0) {
    return "-";
  }
  return format_value(is_rate, s.min) + " - " + format_value(is_rate, s.max);
}

// How many times better tide is: higher rate, or lower latency.
double ratio(const Row& r) {
  Stats t = stats(r.tide);
  Stats p = stats(r.torch);
  if (t.n == 0 || p.n == 0) {
    return NAN;
  }
  return r.is_rate ? t.median / p.median : p.median / t.median;
}

void print_table(const std::vector<Row>& rows) {
  fmt::print(
      "\n| case | tide | torch | ratio (x better) | tide min - max | torch min "
      "- max | runs tide / torch |\n|---|---|---|---|---|---|---|\n");
  for (const auto& r : rows) {
    Stats t = stats(r.tide);
    Stats p = stats(r.torch);
    double x = ratio(r);
    fmt::print(
        "| {} | {} | {} | {} | {} | {} | {} / {} |\n",
        r.label,
        format_value(r.is_rate, t.median),
        format_value(r.is_rate, p.median),
        std::isnan(x) ? "-" : fmt::format("{:.1f}x", x),
        format_range(r.is_rate, t),
        format_range(r.is_rate, p),
        t.n,
        p.n);
  }
  for (const auto& r : rows) {
    if (!r.error.empty()) {
      fmt::print("\nerror in \"{}\": {}\n", r.label, r.error);
    }
  }
}

std::string summary_key(const std::string& label) {
  std::string key;
  for (char c : label) {
    key += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  }
  return key;
}

void print_machine() {
  fmt::print(
      "timer_bench {} on {} ({} cores), load average {}\n",
      now_utc(),
      kernel(),
      std::thread::hardware_concurrency(),
      load_average());
}

int run(const Options& o) {
  bool tide = contains(o.sides, "tide");
  bool torch = contains(o.sides, "torch");
  print_machine();
  fmt::print(
      "throughput: pairs per client and run tide {}, torch {}; {} runs; "
      "max_interval {} s; end to end (start signal to the server having "
      "applied every request)\n"
      "expiry: {} reps, timer {} s ahead, armed after a random pause of up "
      "to max_interval, SIGKILL, death seen on a pidfd\n\n",
      o.tide_pairs,
      o.torch_pairs,
      o.reps,
      o.throughput_interval_s,
      o.expiry_reps,
      o.after_s);
  std::fflush(stdout);

  std::vector<Row> rows;
  auto guarded = [&](Row& row, auto&& body) {
    try {
      body();
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      row.error += (row.error.empty() ? "" : "; ") + std::string(e.what());
      fmt::print(stderr, "{}: {}\n", row.label, e.what());
    }
  };
  std::vector<int> client_counts;
  for (double c : split_doubles(o.clients)) {
    client_counts.push_back(static_cast<int>(c));
  }
  if (contains(o.cases, "throughput")) {
    for (std::string_view kind : {"file", "local"}) {
      if (kind == "local" && !o.local) {
        continue;
      }
      for (int c : client_counts) {
        Row row{
            .label = fmt::format(
                "acquire+release pairs/s, {}, {} client{}",
                kind == "file" ? "FileTimer" : "LocalTimer (tide only)",
                c,
                c == 1 ? "" : "s"),
        };
        if (tide) {
          for (int rep = 0; rep < o.reps; ++rep) {
            guarded(row, [&] {
              auto m = tide_throughput_run(o, kind, c, o.tide_pairs);
              row.tide.push_back(m["pairs_per_s"]);
              fmt::print(
                  "RESULT tide throughput kind={} clients={} pairs={:.0f} "
                  "rep={} seconds={:.6f} pairs_per_s={:.1f} "
                  "client_pairs_per_s={:.1f}\n",
                  kind,
                  c,
                  m["pairs"],
                  rep,
                  m["seconds"],
                  m["pairs_per_s"],
                  m["client_pairs_per_s"]);
              std::fflush(stdout);
            });
          }
        }
        if (torch && kind == "file") {
          guarded(row, [&] {
            auto lines = run_peer(
                o,
                {"--mode=throughput",
                 fmt::format("--clients={}", c),
                 fmt::format("--pairs={}", o.torch_pairs),
                 fmt::format("--reps={}", o.reps),
                 fmt::format("--max-interval={}", o.throughput_interval_s)});
            for (auto& f : lines) {
              row.torch.push_back(parse_double(f["pairs_per_s"], "rate"));
            }
          });
        }
        rows.push_back(std::move(row));
      }
    }
  }
  if (contains(o.cases, "expiry")) {
    for (std::string_view kind : {"file", "local"}) {
      if (kind == "local" && !o.local) {
        continue;
      }
      for (double iv : split_doubles(o.intervals)) {
        Row row{
            .label = fmt::format(
                "expiry-to-kill median, {}, max_interval {} s",
                kind == "file" ? "FileTimer" : "LocalTimer (tide only)",
                iv),
            .is_rate = false,
        };
        if (tide) {
          guarded(row, [&] { row.tide = tide_expiry(o, kind, iv); });
        }
        if (torch && kind == "file") {
          guarded(row, [&] {
            auto lines = run_peer(
                o,
                {"--mode=expiry",
                 fmt::format("--max-interval={}", iv),
                 fmt::format("--reps={}", o.expiry_reps),
                 fmt::format("--after={}", o.after_s)});
            for (auto& f : lines) {
              row.torch.push_back(parse_double(f["latency_s"], "latency"));
            }
          });
        }
        rows.push_back(std::move(row));
      }
    }
  }

  print_table(rows);
  fmt::print("\n");
  bool ok = true;
  for (const auto& r : rows) {
    Stats t = stats(r.tide);
    Stats p = stats(r.torch);
    fmt::print(
        "RESULT summary case={} tide_median={} torch_median={} ratio={} "
        "tide_n={} torch_n={}\n",
        summary_key(r.label),
        t.median,
        p.median,
        ratio(r),
        t.n,
        p.n);
    ok = ok && r.error.empty();
  }
  // The targets.
  fmt::print("\nTargets:\n");
  for (const auto& r : rows) {
    if (r.label.find("FileTimer") == std::string::npos) {
      continue;
    }
    if (r.is_rate) {
      double x = ratio(r);
      fmt::print(
          "  {}: {:.1f}x torch (target 10x): {}\n",
          r.label,
          x,
          !std::isnan(x) && x >= 10 ? "met" : "NOT met");
    } else {
      double m = stats(r.tide).median;
      fmt::print(
          "  {}: tide {:.2f} ms (target < 5 ms): {}\n",
          r.label,
          m * 1e3,
          !std::isnan(m) && m < 0.005 ? "met" : "NOT met");
    }
  }
  return ok ? 0 : 1;
}

int bench_main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "tide's expiration timers against torch's FileTimerServer: "
      "acquire+release throughput and expiry-to-kill latency"};
  app.add_option("--cases", o.cases, "throughput,expiry")
      ->capture_default_str();
  app.add_option("--sides", o.sides, "tide,torch")->capture_default_str();
  app.add_option("--clients", o.clients, "client process counts")
      ->capture_default_str();
  app.add_option("--tide-pairs", o.tide_pairs, "pairs per tide client and run")
      ->capture_default_str();
  app.add_option(
         "--torch-pairs", o.torch_pairs, "pairs per torch client and run")
      ->capture_default_str();
  app.add_option("--reps", o.reps, "throughput runs per case")
      ->capture_default_str();
  app.add_option("--expiry-reps", o.expiry_reps, "expiring children per case")
      ->capture_default_str();
  app.add_option("--intervals", o.intervals, "max_interval values, s")
      ->capture_default_str();
  app.add_option("--after", o.after_s, "timer expires this far ahead, s")
      ->capture_default_str();
  app.add_option(
         "--throughput-interval",
         o.throughput_interval_s,
         "max_interval of the throughput servers, s")
      ->capture_default_str();
  app.add_flag("!--no-local", o.local, "skip the LocalTimer rows");
  app.add_option("--python", o.python, "a python3 with torch")
      ->capture_default_str();
  app.add_option("--peer", o.peer, "timer_peer.py")->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "bound on each wait, s")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.reps < 1 || o.expiry_reps < 1 || o.tide_pairs < 1 ||
      o.torch_pairs < 1) {
    fmt::print(stderr, "--reps, --expiry-reps and --*-pairs must be >= 1\n");
    return 2;
  }
  install_interrupt_handlers();
  try {
    return run(o);
  } catch (const Interrupted&) {
    fmt::print(stderr, "timer_bench: interrupted\n");
    return 130;
  }
}

}  // namespace
}  // namespace tide::bench

int main(int argc, char** argv) {
  using namespace tide::bench;
  try {
    if (argc >= 2 && argv[1] == kClientMode) {
      return client_main(argc, argv);
    }
    if (argc >= 2 && argv[1] == kExpireMode) {
      return expire_main(argc, argv);
    }
    return bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "timer_bench: %s\n", e.what());
    return 1;
  }
}
