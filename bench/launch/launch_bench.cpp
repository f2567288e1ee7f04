// launch_bench: what a launcher costs, tiderun against torchrun (Debian's
// python3-torch: 1.13.1, or 2.6 in Debian 13, through
// bench/peers/torchrun.py), in one run on one machine:
//
//   launch   wall time of `LAUNCHER --standalone --nproc-per-node=4 /bin/true`,
//            spawn to the launcher's exit;
//   restart  `--max-restarts=1` with restart_worker, whose local rank 1 fails
//            on attempt 0: from the failing worker's exit stamp to the first
//            (and to the last) worker of attempt 1 starting;
//   hang     the same, but rank 1 hangs instead of exiting: under tiderun
//            --heartbeat-timeout=T after heartbeats, from its last one; under
//            torchrun after arming torch's file timer (T s ahead; torch has
//            no heartbeats), from the arming.
//
// Each at the launchers' default monitor interval (tiderun 0.1 s; torchrun
// as its parser says: 5 s in 1.13, 0.1 s in 2.x) and at the smallest they
// accept (tiderun 0.001 s, torchrun 0.1 s).
// Both launchers run the same worker binaries (torchrun with --no_python), so
// only the launcher differs. Runs alternate which launcher goes first; the
// report gives medians, the ratio torch/tide, and lines starting with RESULT
// for scripts. docs/benchmarks.md has the figures and the command that made
// them.
//
// Every run gets a scratch directory, also the launcher's TMPDIR (both put
// their log directories there), removed afterwards. A launcher that outlives
// --timeout gets SIGTERM, then SIGKILL with its process group.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_util.h"

extern char** environ;

namespace tide::bench {
namespace {

namespace fs = std::filesystem;

// Between SIGTERM to a launcher and SIGKILL to its process group: torchrun
// needs about a second to stop its workers and exit.
constexpr int64_t kStopGraceNs = 10'000'000'000;

struct Options {
  std::string tiderun = TIDE_BENCH_TIDERUN;
  std::string restart_worker = TIDE_BENCH_RESTART_WORKER;
  std::string python = "/usr/bin/python3";
  std::string torchrun = TIDE_BENCH_TORCHRUN_PY;
  std::string trivial = "/bin/true";
  std::string cases = "launch,restart";
  std::string launchers = "tide,torch";
  int nproc = 4;
  int reps = 5;
  int slow_reps = 3;
  int warmup = 1;
  double tide_smallest = 0.001;
  double torch_smallest = 0.1;
  double timeout_s = 120;
  double hang_timeout_s = 1;
  // Asked of torchrun's torch before the runs.
  std::string torch_version = "?";
  double torch_default = 5;
};

enum class Launcher { kTide, kTorch };
enum class Interval { kDefault, kSmallest };
enum class Kind { kLaunch, kRestart, kHang };

const char* name(Kind k) {
  return k == Kind::kLaunch    ? "launch"
         : k == Kind::kRestart ? "restart"
                               : "hang";
}

const char* name(Launcher l) {
  return l == Launcher::kTide ? "tide" : "torch";
}

std::string interval_label(const Options& o, Launcher l, Interval i) {
  if (i == Interval::kDefault) {
    return l == Launcher::kTide ? "default(0.1)"
                                : fmt::format("default({})", o.torch_default);
  }
  return fmt::format(
      "{}", l == Launcher::kTide ? o.tide_smallest : o.torch_smallest);
}

// torchrun's torch version and its default monitor interval, as its own
// argument parser has it. False (said on stderr) when torch cannot say.
bool ask_torchrun(Options& o) {
  std::string line = first_line_of(
      {o.python,
       "-c",
       "import torch\n"
       "from torch.distributed.run import get_args_parser\n"
       "print(torch.__version__, "
       "get_args_parser().get_default('monitor_interval'))"},
      120);
  auto space = line.find(' ');
  char* end = nullptr;
  double interval = space == std::string::npos
                        ? 0
                        : std::strtod(line.c_str() + space + 1, &end);
  if (!(interval > 0)) {
    std::fprintf(
        stderr,
        "launch_bench: %s could not tell torch's version and torchrun's "
        "default monitor interval (printed \"%s\")\n",
        o.python.c_str(),
        line.c_str());
    return false;
  }
  o.torch_version = line.substr(0, space);
  o.torch_default = interval;
  return true;
}

std::vector<std::string> command(
    const Options& o, Launcher l, Interval i, Kind k) {
  bool tide = l == Launcher::kTide;
  std::vector<std::string> argv;
  if (tide) {
    argv = {o.tiderun};
  } else {
    argv = {o.python, o.torchrun};
  }
  argv.push_back("--standalone");
  argv.push_back(fmt::format(
      "{}={}", tide ? "--nproc-per-node" : "--nproc_per_node", o.nproc));
  if (k != Kind::kLaunch) {
    argv.push_back(tide ? "--max-restarts=1" : "--max_restarts=1");
  }
  if (k == Kind::kHang && tide) {
    argv.push_back(fmt::format("--heartbeat-timeout={}", o.hang_timeout_s));
  }
  if (i == Interval::kSmallest) {
    argv.push_back(fmt::format(
        "{}={}",
        tide ? "--monitor-interval" : "--monitor_interval",
        tide ? o.tide_smallest : o.torch_smallest));
  }
  argv.push_back(tide ? "--no-python" : "--no_python");
  argv.push_back(k == Kind::kLaunch ? o.trivial : o.restart_worker);
  return argv;
}

// The bench's environment with `overrides` (NAME=VALUE) replacing or adding.
std::vector<std::string> child_env(
    const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv = *e;
    auto eq = kv.find('=');
    if (overrides.count(std::string(kv.substr(0, eq))) == 0) {
      env.emplace_back(kv);
    }
  }
  for (const auto& [k, v] : overrides) {
    env.push_back(k + "=" + v);
  }
  return env;
}

std::string tail_of(const fs::path& file, size_t max_chars) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max_chars ? "..." + s.substr(s.size() - max_chars) : s;
}

// One run's figures, in seconds; empty `error` if it counts.
struct Run {
  std::string error;
  std::map<std::string, double> metrics;
};

// Throws std::runtime_error naming the file if it is missing or malformed.
int64_t read_stamp(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text)) {
    throw std::runtime_error("missing stamp " + file.filename().string());
  }
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    throw std::runtime_error("bad stamp " + file.filename().string());
  }
  return v;
}

Run run_once(const Options& o, Launcher l, Interval i, Kind k) {
  ScratchDir scratch("launch_bench");
  fs::path out = scratch.path() / "out";
  fs::path tmp = scratch.path() / "tmp";
  fs::create_directory(out);
  fs::create_directory(tmp);
  fs::path err_file = scratch.path() / "stderr";
  std::map<std::string, std::string> vars = {
      {"TIDE_BENCH_RESTART_OUT", out.string()},
      {"TMPDIR", tmp.string()},
  };
  if (k == Kind::kHang) {
    vars["TIDE_BENCH_HANG_TIMEOUT"] = fmt::format("{}", o.hang_timeout_s);
    if (l == Launcher::kTorch) {
      vars["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
    }
  }
  auto env = child_env(vars);
  Run run;
  Child child(
      command(o, l, i, k),
      ChildOptions{
          .env = std::move(env),
          .stderr_path = err_file.string(),
          // So that a stuck launcher and what it left behind in its group
          // can be killed together.
          .own_group = true,
          .die_with_parent = false,
          // SIGTERM first, so that the launcher stops its workers (some may
          // sit in process groups of their own).
          .stop_grace_ns = kStopGraceNs,
      });
  int64_t start = child.start_ns();
  if (!child.wait_until(start + static_cast<int64_t>(o.timeout_s * 1e9))) {
    run.error = fmt::format("timed out after {} s", o.timeout_s);
  } else if (child.status() != 0) {
    run.error = describe_status(child.status());
  }
  if (!run.error.empty()) {
    run.error += "; stderr: " + tail_of(err_file, 1500);
    return run;
  }
  double s = 1e-9;
  run.metrics["wall_s"] = static_cast<double>(child.exit_ns() - start) * s;
  if (k == Kind::kLaunch) {
    return run;
  }
  try {
    int64_t fail = read_stamp(out / "fail");
    int64_t first0 = INT64_MAX;
    int64_t first1 = INT64_MAX;
    int64_t last1 = INT64_MIN;
    for (int r = 0; r < o.nproc; ++r) {
      // A worker of attempt 0 may be stopped before it stamps: its launcher
      // saw rank 1 fail first.
      if (fs::path a0 = out / fmt::format("start_a0_r{}", r); fs::exists(a0)) {
        first0 = std::min(first0, read_stamp(a0));
      }
      int64_t s1 = read_stamp(out / fmt::format("start_a1_r{}", r));
      first1 = std::min(first1, s1);
      last1 = std::max(last1, s1);
    }
    if (fs::exists(out / "start_a2_r0")) {
      throw std::runtime_error("a third attempt ran (max restarts is 1)");
    }
    run.metrics["first_start_s"] = static_cast<double>(first0 - start) * s;
    run.metrics["restart_s"] = static_cast<double>(first1 - fail) * s;
    run.metrics["restart_all_s"] = static_cast<double>(last1 - fail) * s;
    run.metrics["tail_s"] = static_cast<double>(child.exit_ns() - last1) * s;
  } catch (const std::runtime_error& e) {
    run.error = e.what();
    run.metrics.clear();
  }
  return run;
}

std::string fmt_dur(double s) {
  return format_duration(s, 1);
}

// The reps of one (kind, interval, launcher).
struct Series {
  std::map<std::string, std::vector<double>> metrics;
  int failed = 0;

  double med(const std::string& metric) const {
    auto it = metrics.find(metric);
    return it == metrics.end() ? std::nan("") : median(it->second);
  }
  std::string range(const std::string& metric) const {
    auto it = metrics.find(metric);
    if (it == metrics.end() || it->second.empty()) {
      return "-";
    }
    auto [lo, hi] = std::minmax_element(it->second.begin(), it->second.end());
    return fmt_dur(*lo) + " - " + fmt_dur(*hi);
  }
  size_t runs() const {
    return metrics.empty() ? 0 : metrics.begin()->second.size();
  }
};

std::string fmt_ratio(double torch, double tide) {
  if (std::isnan(torch) || std::isnan(tide) || tide <= 0) {
    return "-";
  }
  double r = torch / tide;
  return r >= 10 ? fmt::format("{:.0f}x", r) : fmt::format("{:.1f}x", r);
}

using SeriesKey = std::tuple<Kind, Interval, Launcher>;

int bench_main(int argc, char** argv) {
  CLI::App app{
      "launch_bench: tiderun against torchrun, launch wall time and "
      "failure-to-restart latency, in one run",
      "launch_bench"};
  Options o;
  app.add_option("--tiderun", o.tiderun, "tiderun binary")
      ->capture_default_str();
  app.add_option(
         "--restart-worker", o.restart_worker, "worker of the restart cases")
      ->capture_default_str();
  app.add_option("--python", o.python, "Python with torch for torchrun")
      ->capture_default_str();
  app.add_option("--torchrun", o.torchrun, "torchrun.py (see its header)")
      ->capture_default_str();
  app.add_option("--trivial", o.trivial, "worker of the launch cases")
      ->capture_default_str();
  app.add_option("--cases", o.cases, "launch,restart,hang or some of them")
      ->capture_default_str();
  app.add_option(
         "--launchers", o.launchers, "tide,torch or one of them (diagnosis)")
      ->capture_default_str();
  app.add_option("--nproc", o.nproc, "workers per launch")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  app.add_option("--reps", o.reps, "runs per launcher and case")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option(
         "--slow-reps",
         o.slow_reps,
         "runs of torchrun at its default interval when that is 1 s or more "
         "(torch 1.13's 5 s: each takes 5-11 s)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--warmup", o.warmup, "unrecorded launches of each first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_option(
         "--tide-smallest", o.tide_smallest, "tiderun's smallest interval, s")
      ->capture_default_str();
  app.add_option(
         "--torch-smallest",
         o.torch_smallest,
         "torchrun's smallest interval, s")
      ->capture_default_str();
  app.add_option(
         "--hang-timeout",
         o.hang_timeout_s,
         "the hang cases' heartbeat timeout (torch: timer), s")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout", o.timeout_s, "seconds one launcher run may take")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::vector<Kind> kinds;
  if (o.cases.find("launch") != std::string::npos) {
    kinds.push_back(Kind::kLaunch);
  }
  if (o.cases.find("restart") != std::string::npos) {
    kinds.push_back(Kind::kRestart);
  }
  if (o.cases.find("hang") != std::string::npos) {
    kinds.push_back(Kind::kHang);
  }
  if (kinds.empty()) {
    std::fprintf(stderr, "--cases: expected launch, restart, hang or some\n");
    return 2;
  }
  bool run_tide = o.launchers.find("tide") != std::string::npos;
  bool run_torch = o.launchers.find("torch") != std::string::npos;
  if (!run_tide && !run_torch) {
    std::fprintf(stderr, "--launchers: expected tide, torch or both\n");
    return 2;
  }
  for (const auto& f : {o.tiderun, o.restart_worker, o.python, o.torchrun}) {
    if (::access(f.c_str(), R_OK) != 0) {
      std::fprintf(stderr, "launch_bench: cannot read %s\n", f.c_str());
      return 2;
    }
  }

  install_interrupt_handlers();
  if (run_torch) {
    if (!ask_torchrun(o)) {
      return 2;
    }
  }

  std::string command_line =
      join(std::vector<std::string>(argv, argv + argc), " ");
  std::string sanitizer = TIDE_BENCH_SANITIZE;
  if (sanitizer == "OFF" || sanitizer == "0") {
    sanitizer.clear();
  }
  std::string load_before = load_average();
  std::string date = now_local();
  std::fprintf(stderr, "launch_bench: %s\n", command_line.c_str());

  const Launcher launchers[] = {Launcher::kTide, Launcher::kTorch};
  const Interval intervals[] = {Interval::kDefault, Interval::kSmallest};
  std::map<SeriesKey, Series> results;
  int failed_runs = 0;
  try {
    for (int w = 0; w < o.warmup; ++w) {
      for (Launcher l : launchers) {
        if (!(l == Launcher::kTide ? run_tide : run_torch)) {
          continue;
        }
        Run r = run_once(o, l, Interval::kSmallest, Kind::kLaunch);
        std::fprintf(
            stderr,
            "warm-up %s: %s\n",
            name(l),
            r.error.empty() ? fmt_dur(r.metrics["wall_s"]).c_str()
                            : r.error.c_str());
      }
    }
    for (Kind k : kinds) {
      for (Interval i : intervals) {
        int torch_reps = i == Interval::kDefault && o.torch_default >= 1
                             ? o.slow_reps
                             : o.reps;
        for (int rep = 0; rep < std::max(o.reps, torch_reps); ++rep) {
          // Alternate which launcher goes first.
          Launcher order[2] = {launchers[rep % 2], launchers[1 - rep % 2]};
          for (Launcher l : order) {
            bool tide = l == Launcher::kTide;
            int n = 0;
            if (tide && run_tide) {
              n = o.reps;
            } else if (!tide && run_torch) {
              n = torch_reps;
            }
            if (rep >= n) {
              continue;
            }
            Run r = run_once(o, l, i, k);
            Series& series = results[{k, i, l}];
            std::string line = fmt::format(
                "{} {} interval={} rep {}/{}:",
                name(k),
                name(l),
                interval_label(o, l, i),
                rep + 1,
                n);
            if (!r.error.empty()) {
              ++series.failed;
              ++failed_runs;
              std::fprintf(
                  stderr, "%s FAILED: %s\n", line.c_str(), r.error.c_str());
              continue;
            }
            for (const auto& [m, v] : r.metrics) {
              series.metrics[m].push_back(v);
              line += fmt::format(" {}={}", m, fmt_dur(v));
            }
            std::fprintf(stderr, "%s\n", line.c_str());
          }
        }
      }
    }
  } catch (const Interrupted&) {
    std::fprintf(stderr, "launch_bench: interrupted; launchers stopped\n");
    return 130;
  }

  // The report: markdown for docs/benchmarks.md, then RESULT lines.
  std::printf("Date: %s\n\n", date.c_str());
  std::printf("Command: `%s`\n\n", command_line.c_str());
  std::printf(
      "Machine: %s, %u cores; load average %s before, %s after. "
      "launch_bench built %s%s.\n\n",
      kernel().c_str(),
      std::max(1u, std::thread::hardware_concurrency()),
      load_before.c_str(),
      load_average().c_str(),
      TIDE_BENCH_BUILD_TYPE,
      sanitizer.empty() ? "" : (", sanitizer " + sanitizer).c_str());
  if (run_torch) {
    std::printf(
        "torch %s (torchrun's default monitor interval %g s).\n\n",
        o.torch_version.c_str(),
        o.torch_default);
  }
  for (Launcher l : launchers) {
    std::printf(
        "- %s: `%s`\n",
        name(l),
        join(command(o, l, Interval::kSmallest, Kind::kRestart), " ").c_str());
  }
  std::printf(
      "\n| case | monitor interval tide / torch | tide median | torch median "
      "| torch / tide | tide min-max | torch min-max | runs tide / torch "
      "|\n|---|---|---|---|---|---|---|---|\n");
  struct Row {
    Kind kind;
    const char* metric;
    std::string label;
  };
  std::vector<Row> rows;
  for (Kind k : kinds) {
    if (k == Kind::kLaunch) {
      rows.push_back(
          {k,
           "wall_s",
           fmt::format("launch: {} x {}, wall time", o.nproc, o.trivial)});
    } else if (k == Kind::kHang) {
      rows.push_back(
          {k,
           "restart_s",
           fmt::format(
               "hang ({} s timeout): last heartbeat (torch: timer armed) -> "
               "first worker of attempt 1 starts",
               o.hang_timeout_s)});
      rows.push_back(
          {k,
           "restart_all_s",
           fmt::format(
               "hang ({} s timeout): -> all {} of attempt 1 started",
               o.hang_timeout_s,
               o.nproc)});
    } else {
      rows.push_back(
          {k,
           "restart_s",
           "restart: a worker fails -> first worker of attempt 1 starts"});
      rows.push_back(
          {k,
           "restart_all_s",
           fmt::format(
               "restart: a worker fails -> all {} of attempt 1 started",
               o.nproc)});
      rows.push_back({k, "wall_s", "restart run (2 attempts), wall time"});
    }
  }
  for (const Row& row : rows) {
    for (Interval i : intervals) {
      const Series& tide = results[{row.kind, i, Launcher::kTide}];
      const Series& torch = results[{row.kind, i, Launcher::kTorch}];
      double a = tide.med(row.metric);
      double b = torch.med(row.metric);
      std::string interval =
          i == Interval::kDefault
              ? fmt::format("0.1 s / {} s (defaults)", o.torch_default)
              : fmt::format("{} s / {} s", o.tide_smallest, o.torch_smallest);
      std::printf(
          "| %s | %s | %s | %s | %s | %s | %s | %zu / %zu |\n",
          row.label.c_str(),
          interval.c_str(),
          fmt_dur(a).c_str(),
          fmt_dur(b).c_str(),
          fmt_ratio(b, a).c_str(),
          tide.range(row.metric).c_str(),
          torch.range(row.metric).c_str(),
          tide.runs(),
          torch.runs());
    }
  }

  // The targets, judged conservatively: tiderun's slower setting
  // against torchrun's faster one.
  std::printf("\n");
  auto worst_tide = [&](Kind k, const char* m) {
    return std::max(
        results[{k, Interval::kDefault, Launcher::kTide}].med(m),
        results[{k, Interval::kSmallest, Launcher::kTide}].med(m));
  };
  auto best_torch = [&](Kind k, const char* m) {
    return std::min(
        results[{k, Interval::kDefault, Launcher::kTorch}].med(m),
        results[{k, Interval::kSmallest, Launcher::kTorch}].med(m));
  };
  std::vector<std::string> target_lines;
  auto ran = [&](Kind k) {
    return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
  };
  if (ran(Kind::kLaunch) && run_tide && run_torch) {
    double tide = worst_tide(Kind::kLaunch, "wall_s");
    double torch = best_torch(Kind::kLaunch, "wall_s");
    double speedup = torch / tide;
    std::printf(
        "Target: launch at least 50x faster than torchrun's fastest setting: "
        "tide %s (slower setting) vs torch %s (faster setting) = %s, %s.\n",
        fmt_dur(tide).c_str(),
        fmt_dur(torch).c_str(),
        fmt_ratio(torch, tide).c_str(),
        speedup >= 50 ? "met" : "NOT met");
    target_lines.push_back(fmt::format(
        "RESULT target launch_speedup={:.1f} goal>=50 met={}",
        speedup,
        speedup >= 50 ? "yes" : "no"));
  }
  if (ran(Kind::kRestart) && run_tide) {
    double tide = worst_tide(Kind::kRestart, "restart_s");
    std::printf(
        "Target: median failure-to-restart under 20 ms: tide %s (slower "
        "setting), %s.\n",
        fmt_dur(tide).c_str(),
        tide < 0.020 ? "met" : "NOT met");
    target_lines.push_back(fmt::format(
        "RESULT target restart_median_ms={:.2f} goal<20 met={}",
        tide * 1e3,
        tide < 0.020 ? "yes" : "no"));
  }
  if (ran(Kind::kHang) && run_tide) {
    double tide = worst_tide(Kind::kHang, "restart_all_s");
    double bound = o.hang_timeout_s + 1;
    std::printf(
        "Target: a hung rank detected and the group running again within "
        "heartbeat-timeout + 1 s = %s: tide %s (all workers started, slower "
        "setting), %s.\n",
        fmt_dur(bound).c_str(),
        fmt_dur(tide).c_str(),
        tide < bound ? "met" : "NOT met");
    target_lines.push_back(fmt::format(
        "RESULT target hang_to_running_s={:.3f} goal<{:.3f} met={}",
        tide,
        bound,
        tide < bound ? "yes" : "no"));
  }
  if (failed_runs > 0) {
    std::printf(
        "\n%d runs failed (see stderr); medians omit them.\n", failed_runs);
  }
  std::printf("\n");
  for (const auto& [key, series] : results) {
    auto [k, i, l] = key;
    for (const auto& [m, v] : series.metrics) {
      std::printf(
          "RESULT %s launcher=%s nproc=%d monitor_interval=%s %s "
          "median=%.6f min=%.6f max=%.6f n=%zu failed=%d\n",
          name(k),
          name(l),
          o.nproc,
          interval_label(o, l, i).c_str(),
          m.c_str(),
          median(v),
          *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end()),
          v.size(),
          series.failed);
    }
  }
  for (const auto& t : target_lines) {
    std::printf("%s\n", t.c_str());
  }
  return failed_runs > 0 ? 1 : 0;
}

}  // namespace
}  // namespace tide::bench

int main(int argc, char** argv) {
  try {
    return tide::bench::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_bench: %s\n", e.what());
    return 1;
  }
}
