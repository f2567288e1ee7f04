// rendezvous_bench: how long one rendezvous round takes for N simulated
// agents, tide's dynamic rendezvous against torch's c10d dynamic rendezvous
// (Debian's python3-torch 1.13.1, through bench/peers/torch_rdzv_peer.py),
// in one run on one machine.
//
//   tide   N agents in this process, each a thread with its own handler from
//          tide's registry (backend "c10d", min_nodes = max_nodes = N), so
//          its own TCP connection to a tide-store server run as a separate
//          process for the whole bench (one more connection per agent for
//          its keep-alive thread, opened as the round completes). All
//          handlers are made first (the connect time), then one "go"
//          releases every agent into next_rendezvous(); the round time runs
//          from go to the last return. Fresh run id per rep.
//   etcd   the same over tide's "etcd" backend and an etcd 3.4 the bench
//          starts; reported as skipped while tide has no such backend.
//   torch  torch_rdzv_peer.py: the same protocol with torch's handlers in up
//          to 8 worker processes, against torch's TCPStore, one JSON line
//          per rep. Bounded by --torch-timeout per rep, fewer reps at large
//          N, and not run above --torch-max-n.
//
// A rep is ok only if every agent returned, the ranks are exactly 0..N-1,
// every world size is N and (tide) every agent reports the same round. After
// a tide rep the handlers are destroyed (--teardown shutdown: shutdown()
// first) and the next rep waits for their keep-alive threads to end.
//
// The report: a markdown table of medians with min-max, the ratio
// torch/tide and tide's round time per node; a second table of where
// tide's time goes (connect, the joins and the close with --phases, CPU of
// the agents and of the server, context switches, teardown); the targets;
// and lines starting with RESULT. --json writes one JSON line per rep. Its
// figures, and the command that made them, go in docs/benchmarks.md.
//
// Every child (tide-store, etcd, the torch peer) dies with the bench
// (PR_SET_PDEATHSIG) and every wait has a deadline.
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/rendezvous/dynamic_rendezvous.h"
#include "tide/store/hash_store.h"
#include "tide/store/tcp_store.h"

#include "agent_round.h"
#include "bench_util.h"
#include "etcd_server.h"
#include "server_process.h"

namespace tide::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// torch runs --torch-large-reps reps from this N on.
constexpr int kTorchLargeN = 512;
// Bound on the torch peer's start (importing torch) on top of its reps.
constexpr double kTorchStartS = 60;
// Per rep on top of --torch-timeout: the peer's own setup bound (30 s) and
// its workers' exit (5 s), with room.
constexpr double kTorchRepSlackS = 45;
constexpr auto kServerStartTimeout = std::chrono::milliseconds(10'000);
constexpr double kEtcdStartS = 20;

struct Options {
  std::string ns = "8,64,512,2048";
  int reps = 5;
  std::string impls = "tide,torch,etcd";
  int torch_max_n = 512;
  int torch_reps = 3;
  int torch_large_reps = 1;
  double torch_timeout_s = 60;
  double timeout_s = 60;
  double keep_alive_s = 1;
  std::string teardown = "destroy";
  bool phases = false;
  bool keep_alive_local = false;
  std::string json_path;
  std::string python = "/usr/bin/python3";
  std::string peer = TIDE_BENCH_TORCH_RDZV_PEER;
  std::string tide_store = TIDE_BENCH_TIDE_STORE;
  std::string etcd = "/usr/bin/etcd";
};

bool contains(const std::string& list, std::string_view item) {
  for (const auto& x : split(list)) {
    if (x == item) {
      return true;
    }
  }
  return false;
}

// One implementation at one N: its reps.
struct Cell {
  int attempts = 0;
  // Of the ok reps, by name ("round_s", "median_s", ...); NaNs left out.
  std::map<std::string, std::vector<double>> values;
  // Of the failed ones.
  std::vector<std::string> errors;
  // Why it did not run, if it did not.
  std::string skipped;

  size_t ok() const {
    auto it = values.find("round_s");
    return it == values.end() ? 0 : it->second.size();
  }
  Stats get(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? Stats{} : stats(it->second);
  }
};

// JSON lines to --json's file (nothing without one).
class JsonLines {
 public:
  explicit JsonLines(const std::string& path) {
    if (!path.empty()) {
      out_.open(path, std::ios::trunc);
      if (!out_) {
        throw std::runtime_error("cannot write " + path);
      }
    }
  }
  void write(const json& j) {
    if (out_.is_open()) {
      out_ << j.dump() << '\n';
      out_.flush();
    }
  }

 private:
  std::ofstream out_;
};

// 2048 agents hold two connections each: lift the soft descriptor limit to
// the hard one. Children (tide-store, etcd) inherit it.
rlim_t raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    throw std::runtime_error(errno_text("getrlimit", errno));
  }
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      throw std::runtime_error(errno_text("setrlimit", errno));
    }
  }
  return lim.rlim_cur;
}

// ---------------------------------------------------------------------------
// tide.

std::string impl_name(std::string_view impl) {
  if (impl == "tide") {
    return "tide-c10d";
  }
  if (impl == "etcd") {
    return "tide-etcd";
  }
  return "torch-c10d";
}

// A tide backend's server, as run_tide uses it.
struct Backend {
  std::string endpoint;
  // Makes every client call fail at once (the interrupt path).
  std::function<void()> stop;
  // Its CPU seconds so far; empty if unknown.
  std::function<double()> cpu;
};

// Diagnostic (--keep-alive-local): a c10d handler as the registry makes it
// with is_host=false, except that its keep-alive thread talks to an
// in-process HashStore of its own, so the round no longer pays for the
// keep-alive connections and their first requests on the server.
std::unique_ptr<rendezvous::RendezvousHandler> make_local_keep_alive_handler(
    const rendezvous::RendezvousParameters& p) {
  size_t colon = p.endpoint.rfind(':');
  auto remote = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = p.endpoint.substr(0, colon),
      .port = static_cast<uint16_t>(std::stoi(p.endpoint.substr(colon + 1))),
      .timeout = p.get_as_seconds("read_timeout", std::chrono::seconds(60)),
  });
  std::shared_ptr<store::Store> local = store::make_hash_store();
  return std::make_unique<rendezvous::DynamicRendezvousHandler>(
      "c10d",
      rendezvous::make_store_backend(
          remote, [local] { return local; }, p.run_id),
      rendezvous::DynamicRendezvousSettings::from(p),
      rendezvous::NodeDesc::make(p.local_addr));
}

// An ok round's figures, in the order of the RESULT lines.
std::vector<std::pair<std::string, double>> figures(
    const RoundResult& r, int n) {
  return {
      {"round_s", r.round_s},
      {"median_s", r.median_s},
      {"first_s", r.first_s},
      {"per_node_s", r.round_s / n},
      {"connect_s", r.connect_s},
      {"joined_s", r.joined_s},
      {"closed_s", r.closed_s},
      {"cpu_s", r.cpu_s},
      {"server_cpu_s", r.server_cpu_s},
      {"switches", static_cast<double>(r.switches)},
      {"teardown_s", r.teardown_s},
      {"drain_s", r.drain_s},
  };
}

// The reps of one tide backend at one N. Ends the cell early when the
// backend does not exist, and after a failed rep.
Cell run_tide(
    const Options& o,
    std::string_view impl,
    int n,
    const Backend& backend,
    JsonLines& out) {
  Cell cell;
  bool etcd = impl == "etcd";
  std::map<std::string, std::string> config{
      {"keep_alive_interval", fmt::format("{}", o.keep_alive_s)},
      {"join_timeout", fmt::format("{}", o.timeout_s)},
  };
  if (!etcd) {
    config["is_host"] = "false";
    config["read_timeout"] = fmt::format("{}", o.timeout_s);
  }
  std::string name = impl_name(impl);
  for (int rep = 0; rep < o.reps; ++rep) {
    RoundOptions ro{
        .backend = etcd ? "etcd" : "c10d",
        .endpoint = backend.endpoint,
        .run_id =
            fmt::format("rdzv_bench_{}_{}_{}_{}", ::getpid(), impl, n, rep),
        .n = n,
        .config = config,
        .factory =
            !etcd && o.keep_alive_local
                ? rendezvous::HandlerFactory(make_local_keep_alive_handler)
                : rendezvous::HandlerFactory(),
        .timeout_s = o.timeout_s,
        .shutdown = o.teardown == "shutdown",
        .drain_timeout_s = 2 * o.keep_alive_s + 5,
        .phases = o.phases,
        .server_cpu = backend.cpu,
        .abort = backend.stop,
    };
    RoundResult r = run_round(ro);
    if (r.unknown_backend) {
      cell.skipped = "tide has no \"" + ro.backend + "\" rendezvous backend";
      fmt::print("RESULT {} n={} skipped=1\n", name, n);
      out.write(json{
          {"impl", name},
          {"n", n},
          {"skipped", true},
          {"reason", cell.skipped}});
      std::fflush(stdout);
      return cell;
    }
    ++cell.attempts;
    json line{
        {"impl", name},
        {"n", n},
        {"rep", rep},
        {"ok", r.ok},
        {"teardown", o.teardown},
        {"keep_alive_local", o.keep_alive_local}};
    std::string text =
        fmt::format("RESULT {} n={} rep={} ok={}", name, n, rep, r.ok ? 1 : 0);
    if (r.ok) {
      for (const auto& [key, v] : figures(r, n)) {
        line[key] = std::isnan(v)       ? json(nullptr)
                    : key == "switches" ? json(static_cast<int64_t>(v))
                                        : json(v);
        text += fmt::format(" {}={:.6g}", key, v);
        if (!std::isnan(v)) {
          cell.values[key].push_back(v);
        }
      }
      line["round"] = r.round;
      if (std::isnan(r.drain_s)) {
        fmt::print(
            stderr,
            "{} N={} rep {}: keep-alive threads still running {} s after "
            "teardown\n",
            name,
            n,
            rep,
            ro.drain_timeout_s);
      }
    } else {
      cell.errors.push_back(r.error);
      line["error"] = r.error;
      fmt::print(stderr, "{} N={} rep {} FAILED: {}\n", name, n, rep, r.error);
    }
    fmt::print("{}\n", text);
    out.write(line);
    std::fflush(stdout);
    if (!r.ok) {
      // A failed round may have waited out the timeout; more of the same
      // would only take longer.
      break;
    }
  }
  return cell;
}

// ---------------------------------------------------------------------------
// torch.

// The last lines of a log file, for an error message.
std::string tail_of(const fs::path& path) {
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  constexpr size_t kTail = 800;
  return text.size() > kTail ? "..." + text.substr(text.size() - kTail) : text;
}

// One run of the torch peer: reps at N, its lines echoed as RESULT lines.
// Its log goes to a scratch file, quoted when the peer itself fails.
Cell run_torch(const Options& o, int n, JsonLines& out) {
  Cell cell;
  int reps = n >= kTorchLargeN ? o.torch_large_reps : o.torch_reps;
  ScratchDir scratch("rendezvous_bench_torch");
  fs::path log = scratch.path() / "peer.stderr";
  Child peer(
      {o.python,
       o.peer,
       "--n",
       std::to_string(n),
       "--reps",
       std::to_string(reps),
       "--timeout",
       fmt::format("{}", o.torch_timeout_s)},
      ChildOptions{
          .pipes = true,
          .stderr_path = log.string(),
          .own_group = true,
          .name = "torch peer"});
  peer.close_in();
  LineReader reader(peer.out());
  double bound_s = kTorchStartS + reps * (o.torch_timeout_s + kTorchRepSlackS);
  int64_t deadline = deadline_after(bound_s);
  try {
    while (auto line = reader.next(deadline, "the torch peer")) {
      json j = json::parse(*line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("ok")) {
        continue;
      }
      ++cell.attempts;
      int rep = j.value("rep", -1);
      if (j.value("ok", false)) {
        std::string text =
            fmt::format("RESULT torch-c10d n={} rep={} ok=1", n, rep);
        for (const char* key : {"round_s", "median_s", "connect_s"}) {
          double v = j.value(key, NAN);
          text += fmt::format(" {}={:.6g}", key, v);
          if (!std::isnan(v)) {
            cell.values[key].push_back(v);
          }
        }
        fmt::print("{}\n", text);
      } else {
        cell.errors.push_back(j.value("error", std::string("?")));
        fmt::print("RESULT torch-c10d n={} rep={} ok=0\n", n, rep);
      }
      std::fflush(stdout);
      out.write(j);
    }
  } catch (const DeadlineExceeded&) {
    cell.errors.push_back(fmt::format(
        "the torch peer had not finished its {} rep(s) after {} s",
        reps,
        bound_s));
    cell.attempts = reps;
    peer.stop();
    return cell;
  }
  if (!peer.wait_until(deadline_after(10))) {
    peer.stop();
  } else if (peer.status() != 0) {
    cell.errors.push_back(fmt::format(
        "the torch peer failed ({}); its log ends: {}",
        describe_status(peer.status()),
        tail_of(log)));
  }
  if (cell.attempts < reps) {
    cell.errors.push_back(fmt::format(
        "the torch peer reported {} of {} reps; its log ends: {}",
        cell.attempts,
        reps,
        tail_of(log)));
    cell.attempts = reps;
  }
  return cell;
}

// ---------------------------------------------------------------------------
// The report.

std::string range(const Stats& s) {
  if (s.n == 0) {
    return "-";
  }
  return format_duration(s.min, 1) + " - " + format_duration(s.max, 1);
}

std::string per_node(double round_s, int n) {
  if (std::isnan(round_s)) {
    return "-";
  }
  return fmt::format("{:.0f} us", round_s / n * 1e6);
}

std::string runs(const Cell& c) {
  if (!c.skipped.empty()) {
    return "skipped";
  }
  if (c.attempts == 0) {
    return "-";
  }
  return fmt::format("{} / {}", c.ok(), c.attempts);
}

double ratio(const Cell& torch, const Cell& tide) {
  Stats p = torch.get("round_s");
  Stats t = tide.get("round_s");
  if (p.n == 0 || t.n == 0) {
    return NAN;
  }
  return p.median / t.median;
}

using Results = std::map<std::string, std::map<int, Cell>>;

void print_table(const Options& o, const std::vector<int>& ns, Results& res) {
  bool etcd = contains(o.impls, "etcd");
  fmt::print(
      "\n| N | tide round (median) | tide min - max | tide median agent | "
      "tide round / N | tide ok / reps | torch round (median) | torch min - "
      "max | torch ok / attempts | torch / tide |{}\n"
      "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|{}\n",
      etcd ? " etcd round (median) | etcd ok / reps |" : "",
      etcd ? "--:|--:|" : "");
  for (int n : ns) {
    const Cell& tide = res["tide"][n];
    const Cell& torch = res["torch"][n];
    Stats t = tide.get("round_s");
    Stats p = torch.get("round_s");
    double x = ratio(torch, tide);
    std::string etcd_cols;
    if (etcd) {
      const Cell& e = res["etcd"][n];
      etcd_cols = fmt::format(
          " {} | {} |", format_duration(e.get("round_s").median, 1), runs(e));
    }
    fmt::print(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{}\n",
        n,
        format_duration(t.median, 1),
        range(t),
        format_duration(tide.get("median_s").median, 1),
        per_node(t.median, n),
        runs(tide),
        format_duration(p.median, 1),
        range(p),
        torch.skipped.empty() ? runs(torch) : torch.skipped,
        std::isnan(x) ? "-" : fmt::format("{:.0f}x", x),
        etcd_cols);
  }

  // Where tide's time goes.
  fmt::print(
      "\ntide, medians over the ok reps:\n\n"
      "| N | connect (all handlers made) | go -> all joined | go -> round "
      "closed | go -> last return | CPU in the round, agents / server | "
      "context switches per agent | teardown | keep-alive threads gone |\n"
      "|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (int n : ns) {
    const Cell& c = res["tide"][n];
    if (c.ok() == 0) {
      continue;
    }
    auto d = [&c](const char* key) {
      return format_duration(c.get(key).median, 1);
    };
    Stats sw = c.get("switches");
    fmt::print(
        "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {} |\n",
        n,
        d("connect_s"),
        d("joined_s"),
        d("closed_s"),
        d("round_s"),
        d("cpu_s"),
        d("server_cpu_s"),
        sw.n == 0 ? "-" : fmt::format("{:.1f}", sw.median / n),
        d("teardown_s"),
        d("drain_s"));
  }
  for (const auto& [impl, cells] : res) {
    std::string skipped;
    for (const auto& [n, c] : cells) {
      for (const auto& e : c.errors) {
        fmt::print("\n{} N={}: {}", impl_name(impl), n, e);
      }
      if (!c.skipped.empty() && c.skipped != skipped) {
        skipped = c.skipped;
        fmt::print("\n{} from N={}: {}", impl_name(impl), n, skipped);
      }
    }
  }
  fmt::print("\n");
}

void print_targets(const std::vector<int>& ns, Results& res) {
  fmt::print("\nTargets:\n");
  for (auto [n, limit] : {std::pair{512, 0.5}, std::pair{2048, 2.0}}) {
    double m = res["tide"][n].get("round_s").median;
    if (std::isnan(m)) {
      fmt::print("  {}-node round < {} s: not measured\n", n, limit);
      continue;
    }
    fmt::print(
        "  {}-node round < {} s: tide {}: {}\n",
        n,
        limit,
        format_duration(m, 1),
        m < limit ? "met" : "NOT met");
  }
  int largest = 0;
  for (int n : ns) {
    if (res["torch"][n].ok() > 0) {
      largest = n;
    }
  }
  if (largest == 0) {
    fmt::print(
        "  10x torch at the largest N torch completes: torch completed none\n");
    return;
  }
  double x = ratio(res["torch"][largest], res["tide"][largest]);
  fmt::print(
      "  10x torch at the largest N torch completes (N={}): {}: {}\n",
      largest,
      std::isnan(x) ? "-" : fmt::format("{:.0f}x", x),
      !std::isnan(x) && x >= 10 ? "met" : "NOT met");
}

void print_summary(const std::vector<int>& ns, Results& res) {
  fmt::print("\n");
  for (const auto& [impl, cells] : res) {
    for (int n : ns) {
      auto it = cells.find(n);
      if (it == cells.end()) {
        continue;
      }
      const Cell& c = it->second;
      if (c.attempts == 0 && c.skipped.empty()) {
        continue;
      }
      Stats s = c.get("round_s");
      fmt::print(
          "RESULT summary impl={} n={} round_median_s={} round_min_s={} "
          "round_max_s={} agent_median_s={} ok={} attempts={}{}\n",
          impl_name(impl),
          n,
          s.median,
          s.min,
          s.max,
          c.get("median_s").median,
          c.ok(),
          c.attempts,
          c.skipped.empty() ? "" : " skipped=1");
    }
  }
}

// ---------------------------------------------------------------------------
// The run.

int run(const Options& o) {
  std::vector<int> ns;
  for (const auto& s : split(o.ns)) {
    ns.push_back(std::stoi(s));
  }
  rlim_t fds = raise_fd_limit();
  fmt::print(
      "rendezvous_bench {} on {} ({} cores), load average {}\n"
      "N = {}; tide: {} reps, keep_alive_interval {} s, teardown {}{}; "
      "torch: {} reps below N={}, {} from it, up to N={}, timeout {} s a "
      "rep; RLIMIT_NOFILE {}\n\n",
      now_utc(),
      kernel(),
      std::thread::hardware_concurrency(),
      load_average(),
      o.ns,
      o.reps,
      o.keep_alive_s,
      o.teardown,
      std::string(o.phases ? ", phases timed" : "") +
          (o.keep_alive_local ? ", keep-alive on a local store (diagnostic)"
                              : ""),
      o.torch_reps,
      kTorchLargeN,
      o.torch_large_reps,
      o.torch_max_n,
      o.torch_timeout_s,
      fds);
  std::fflush(stdout);
  JsonLines out(o.json_path);

  std::unique_ptr<ServerProcess> store;
  if (contains(o.impls, "tide")) {
    store = std::make_unique<ServerProcess>(
        "tide-store",
        std::vector<std::string>{
            o.tide_store, "--host", "127.0.0.1", "--port", "0"},
        kServerStartTimeout);
  }
  std::unique_ptr<EtcdServer> etcd;
  // Set once tide turned out to have no etcd backend (or there is no etcd).
  std::string etcd_skipped;
  if (!fs::exists(o.etcd)) {
    etcd_skipped = "no etcd at " + o.etcd;
  }
  Results res;
  bool ok = true;
  // A tide backend that failed at some N is not run at larger ones.
  std::string tide_failed;
  for (int n : ns) {
    if (store) {
      Cell& c = res["tide"][n];
      if (!tide_failed.empty()) {
        c.skipped = tide_failed;
      } else {
        Backend backend{
            .endpoint = fmt::format("127.0.0.1:{}", store->port()),
            .stop = [&store] { store->stop(); },
            .cpu = [&store] { return store->cpu_seconds(); },
        };
        c = run_tide(o, "tide", n, backend, out);
        if (!c.errors.empty()) {
          ok = false;
          tide_failed = fmt::format("not run: failed at N={}", n);
        }
      }
    }
    if (contains(o.impls, "etcd")) {
      Cell& c = res["etcd"][n];
      if (!etcd_skipped.empty()) {
        c.skipped = etcd_skipped;
      } else {
        try {
          if (!etcd) {
            etcd = std::make_unique<EtcdServer>(o.etcd, kEtcdStartS);
            fmt::print("etcd listening on {}\n", etcd->endpoint());
            std::fflush(stdout);
          }
          Backend backend{
              .endpoint = etcd->endpoint(),
              .stop = [&etcd] { etcd->stop(); },
              .cpu = [&etcd] { return etcd->cpu_seconds(); },
          };
          c = run_tide(o, "etcd", n, backend, out);
        } catch (const Interrupted&) {
          throw;
        } catch (const std::exception& e) {
          c.errors.push_back(e.what());
        }
        if (!c.errors.empty()) {
          ok = false;
          etcd_skipped = fmt::format("not run: failed at N={}", n);
        }
      }
      if (!c.skipped.empty()) {
        etcd_skipped = c.skipped;
      }
      if (!etcd_skipped.empty()) {
        etcd.reset();
      }
    }
    if (contains(o.impls, "torch")) {
      Cell& c = res["torch"][n];
      if (n > o.torch_max_n) {
        c.skipped =
            fmt::format("skipped (N > --torch-max-n {})", o.torch_max_n);
        out.write(json{
            {"impl", impl_name("torch")},
            {"n", n},
            {"skipped", true},
            {"reason", c.skipped}});
      } else {
        try {
          c = run_torch(o, n, out);
        } catch (const Interrupted&) {
          throw;
        } catch (const std::exception& e) {
          c.errors.push_back(e.what());
        }
      }
    }
  }
  print_table(o, ns, res);
  print_summary(ns, res);
  print_targets(ns, res);
  return ok ? 0 : 1;
}

int bench_main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "one rendezvous round of N simulated agents: tide's dynamic "
      "rendezvous against torch's c10d dynamic rendezvous"};
  app.add_option("--n", o.ns, "agent counts, comma separated")
      ->capture_default_str();
  app.add_option("--reps", o.reps, "tide rounds per N")->capture_default_str();
  app.add_option("--impl", o.impls, "tide,torch,etcd")->capture_default_str();
  app.add_option("--torch-max-n", o.torch_max_n, "no torch run above this N")
      ->capture_default_str();
  app.add_option(
         "--torch-reps",
         o.torch_reps,
         fmt::format("torch rounds per N below N={}", kTorchLargeN))
      ->capture_default_str();
  app.add_option(
         "--torch-large-reps",
         o.torch_large_reps,
         fmt::format("torch rounds per N from N={}", kTorchLargeN))
      ->capture_default_str();
  app.add_option(
         "--torch-timeout",
         o.torch_timeout_s,
         "a torch round not complete this long after go fails, s")
      ->capture_default_str();
  app.add_option(
         "--timeout",
         o.timeout_s,
         "tide: bound on making the handlers and on the round (join_timeout, "
         "read_timeout), s")
      ->capture_default_str();
  app.add_option(
         "--keep-alive",
         o.keep_alive_s,
         "tide: keep_alive_interval, s (a destroyed handler's keep-alive "
         "thread ends within it)")
      ->capture_default_str();
  app.add_option(
         "--teardown",
         o.teardown,
         "after a round: destroy the handlers, or shutdown() them first")
      ->check(CLI::IsMember({"destroy", "shutdown"}))
      ->capture_default_str();
  app.add_flag(
      "--phases",
      o.phases,
      "tide: also time the joins and the close of each round (through "
      "tide's rendezvous events, which then cost a little)");
  app.add_flag(
      "--keep-alive-local",
      o.keep_alive_local,
      "tide c10d, diagnostic: the keep-alive threads use an in-process "
      "store instead of the server (what they cost the round)");
  app.add_option("--json", o.json_path, "write one JSON line per rep here");
  app.add_option("--python", o.python, "a python3 with torch")
      ->capture_default_str();
  app.add_option("--peer", o.peer, "torch_rdzv_peer.py")->capture_default_str();
  app.add_option("--tide-store", o.tide_store, "the tide-store binary")
      ->capture_default_str();
  app.add_option("--etcd", o.etcd, "the etcd binary")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.reps < 1 || o.torch_reps < 1 || o.torch_large_reps < 1 ||
      o.timeout_s <= 0 || o.torch_timeout_s <= 0 || o.keep_alive_s <= 0) {
    fmt::print(stderr, "reps must be >= 1, timeouts and --keep-alive > 0\n");
    return 2;
  }
  for (const auto& s : split(o.ns)) {
    if (s.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(s) < 1) {
      fmt::print(stderr, "--n: \"{}\" is not a positive count\n", s);
      return 2;
    }
  }
  for (const auto& s : split(o.impls)) {
    if (s != "tide" && s != "torch" && s != "etcd") {
      fmt::print(stderr, "--impl: unknown \"{}\" (tide, torch, etcd)\n", s);
      return 2;
    }
  }
  // A real agent logs its handler's info lines to its own stderr; 2048 of
  // them on one would measure the terminal. TIDE_LOG_LEVEL still wins.
  ::setenv("TIDE_LOG_LEVEL", "warn", /*overwrite=*/0);
  install_interrupt_handlers();
  try {
    return run(o);
  } catch (const Interrupted&) {
    fmt::print(stderr, "rendezvous_bench: interrupted\n");
    return 130;
  }
}

}  // namespace
}  // namespace tide::bench

int main(int argc, char** argv) {
  try {
    return tide::bench::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", e.what());
    return 1;
  }
}
