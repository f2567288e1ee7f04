#include "agent_round.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tide/events/events.h"
#include "tide/rendezvous/registry.h"

#include "bench_util.h"

namespace tide::bench {
namespace {

// Longest the main thread waits before looking at the interrupt flag.
constexpr int64_t kPollSliceNs = 100'000'000;
// Room past timeout_s for agents to report a failed round: their own
// deadlines (join_timeout, read_timeout) end it first.
constexpr double kRoundSlackS = 30;
// How often the thread count is read while keep-alive threads drain.
constexpr auto kDrainPoll = std::chrono::milliseconds(2);

double seconds_between(int64_t from_ns, int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) * 1e-9;
}

// Arrivals that the main thread waits for with a deadline, looking at the
// interrupt flag meanwhile. arrive() is thread safe and cheap (an atomic
// add; the lock and notify only for the last arrival).
class Tally {
 public:
  explicit Tally(int target) : target_(target) {}

  void arrive() {
    if (count_.fetch_add(1) + 1 == target_) {
      // Under the lock, so a waiter between its check and its wait cannot
      // miss it.
      std::lock_guard lock(mutex_);
      cv_.notify_all();
    }
  }
  int count() const {
    return count_.load();
  }
  // Whether every arrival came before deadline_ns (mono_ns clock). Throws
  // Interrupted.
  bool wait_until(int64_t deadline_ns) {
    std::unique_lock lock(mutex_);
    while (count_.load() < target_) {
      throw_if_interrupted();
      int64_t left = deadline_ns - mono_ns();
      if (left <= 0) {
        return false;
      }
      cv_.wait_for(
          lock, std::chrono::nanoseconds(std::min(left, kPollSliceNs)));
    }
    return true;
  }

 private:
  const int target_;
  std::atomic<int> count_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
};

// This process's CPU seconds and context switches so far.
struct Usage {
  double cpu_s = 0;
  int64_t switches = 0;

  static Usage now() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    auto s = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) +
             static_cast<double>(t.tv_usec) * 1e-6;
    };
    return Usage{
        .cpu_s = s(u.ru_utime) + s(u.ru_stime),
        .switches = u.ru_nvcsw + u.ru_nivcsw};
  }
};

// Stamps a round's rendezvous events with mono_ns(): the agents' joins and
// the round's close. It knows them by the handler's messages ("joined round
// R as arrival I ...", "round R closed with K node(s)"). Thread safe.
class PhaseRecorder final : public events::EventHandler {
 public:
  void handle(const events::Event&) override {}
  void handle(const events::RdzvEvent& e) override {
    int64_t now = mono_ns();
    bool joined = e.message.find(" as arrival ") != std::string::npos;
    bool closed = e.message.find(" closed with ") != std::string::npos;
    if (!joined && !closed) {
      return;
    }
    std::lock_guard lock(mutex_);
    if (joined) {
      ++joins_;
      last_join_ns_ = std::max(last_join_ns_, now);
    } else {
      closed_ns_ = now;
    }
  }
  // The last join's stamp once n agents joined, else 0.
  int64_t all_joined_ns(int n) {
    std::lock_guard lock(mutex_);
    return joins_ >= n ? last_join_ns_ : 0;
  }
  int64_t closed_ns() {
    std::lock_guard lock(mutex_);
    return closed_ns_;
  }

 private:
  std::mutex mutex_;
  // Guarded by mutex_.
  int joins_ = 0;
  int64_t last_join_ns_ = 0;
  int64_t closed_ns_ = 0;
};

// What one agent thread leaves behind. Written by its thread only; read by
// the main thread after the Tally it arrives at says so.
struct Agent {
  std::unique_ptr<rendezvous::RendezvousHandler> handler;
  std::string error;
  bool teardown_failed = false;
  int rank = -1;
  int world_size = 0;
  int64_t round = -1;
  int64_t done_ns = 0;
};

// One round: the agents, the signals between the phases, the analysis.
// Used once, from the main thread.
class Round {
 public:
  explicit Round(const RoundOptions& o)
      : o_(o),
        params_{
            .backend = o.backend,
            .endpoint = o.endpoint,
            .run_id = o.run_id,
            .min_nodes = o.n,
            .max_nodes = o.n,
            .local_addr = "127.0.0.1",
            .config = o.config,
        },
        agents_(static_cast<size_t>(o.n)),
        ready_(o.n),
        done_(o.n) {}

  RoundResult run();

 private:
  // Body of an agent thread: make the handler, wait for go, one round,
  // wait for teardown, end the handler.
  void agent_main(Agent& a);
  // Opens both gates (once each); agents that have not run skip it.
  void release_all();
  void analyse(RoundResult& r, int64_t go_ns) const;

  const RoundOptions& o_;
  const rendezvous::RendezvousParameters params_;
  std::vector<Agent> agents_;
  Tally ready_;
  Tally done_;
  std::latch go_{1};
  std::latch teardown_{1};
  // Set before go_ opens when the round is given up: agents skip it.
  std::atomic<bool> cancel_{false};
  // Main thread only.
  bool go_open_ = false;
  bool teardown_open_ = false;
};

void Round::agent_main(Agent& a) {
  try {
    a.handler = o_.factory ? o_.factory(params_)
                           : rendezvous::handler_registry().create(params_);
  } catch (const std::exception& e) {
    a.error = std::string("making the handler: ") + e.what();
  }
  ready_.arrive();
  go_.wait();
  if (a.handler && !cancel_.load()) {
    try {
      rendezvous::RendezvousInfo info = a.handler->next_rendezvous();
      a.done_ns = mono_ns();
      a.rank = info.rank;
      a.world_size = info.world_size;
      a.round = info.round;
    } catch (const std::exception& e) {
      a.done_ns = mono_ns();
      a.error = std::string("next_rendezvous: ") + e.what();
    }
  }
  done_.arrive();
  teardown_.wait();
  try {
    if (a.handler && o_.shutdown && !a.handler->shutdown()) {
      a.teardown_failed = true;
    }
  } catch (const std::exception&) {
    a.teardown_failed = true;
  }
  // Detaches the keep-alive thread, which ends within one keep-alive
  // interval and closes its connection then.
  a.handler.reset();
}

void Round::release_all() {
  if (!go_open_) {
    go_open_ = true;
    go_.count_down();
  }
  if (!teardown_open_) {
    teardown_open_ = true;
    teardown_.count_down();
  }
}

RoundResult Round::run() {
  RoundResult r;
  std::vector<std::string> problems;
  int threads_before = thread_count();
  std::vector<std::jthread> threads;
  threads.reserve(agents_.size());
  int64_t go_ns = 0;
  try {
    int64_t start_ns = mono_ns();
    try {
      for (Agent& a : agents_) {
        threads.emplace_back([this, &a] { agent_main(a); });
      }
    } catch (const std::system_error& e) {
      problems.push_back(fmt::format(
          "could start only {} of {} agent threads: {}",
          threads.size(),
          o_.n,
          e.what()));
      cancel_ = true;
    }
    if (!cancel_) {
      if (ready_.wait_until(
              start_ns + static_cast<int64_t>(o_.timeout_s * 1e9))) {
        r.connect_s = seconds_between(start_ns, mono_ns());
      } else {
        problems.push_back(fmt::format(
            "only {} of {} handlers were made within {} s",
            ready_.count(),
            o_.n,
            o_.timeout_s));
        cancel_ = true;
      }
    }
    if (!cancel_) {
      for (const Agent& a : agents_) {
        if (!a.error.empty()) {
          cancel_ = true;  // analyse() reports them
        }
      }
    }
    std::shared_ptr<PhaseRecorder> recorder;
    if (o_.phases) {
      recorder = std::make_shared<PhaseRecorder>();
      events::configure(recorder);
    }
    double server_cpu = o_.server_cpu ? o_.server_cpu() : NAN;
    Usage usage = Usage::now();
    go_ns = mono_ns();
    go_open_ = true;
    go_.count_down();
    if (!cancel_ && !done_.wait_until(
                        go_ns + static_cast<int64_t>(
                                    (o_.timeout_s + kRoundSlackS) * 1e9))) {
      problems.push_back(fmt::format(
          "only {} of {} agents returned from next_rendezvous() within {} s",
          done_.count(),
          o_.n,
          o_.timeout_s + kRoundSlackS));
    }
    Usage used = Usage::now();
    r.cpu_s = used.cpu_s - usage.cpu_s;
    r.switches = used.switches - usage.switches;
    if (o_.server_cpu) {
      r.server_cpu_s = o_.server_cpu() - server_cpu;
    }
    if (recorder) {
      events::configure(nullptr);
      if (int64_t t = recorder->all_joined_ns(o_.n); t != 0) {
        r.joined_s = seconds_between(go_ns, t);
      }
      if (int64_t t = recorder->closed_ns(); t != 0) {
        r.closed_s = seconds_between(go_ns, t);
      }
    }
    int64_t teardown_ns = mono_ns();
    release_all();
    for (auto& t : threads) {
      t.join();
    }
    r.teardown_s = seconds_between(teardown_ns, mono_ns());
    int64_t drain_deadline =
        teardown_ns + static_cast<int64_t>(o_.drain_timeout_s * 1e9);
    for (;;) {
      throw_if_interrupted();
      if (thread_count() <= threads_before) {
        r.drain_s = seconds_between(teardown_ns, mono_ns());
        break;
      }
      if (mono_ns() > drain_deadline) {
        break;
      }
      std::this_thread::sleep_for(kDrainPoll);
    }
  } catch (...) {
    // Interrupted, or the bench itself failing: let every agent run out.
    events::configure(nullptr);
    cancel_ = true;
    if (interrupted() && o_.abort) {
      o_.abort();
    }
    release_all();
    threads.clear();  // joins
    throw;
  }
  analyse(r, go_ns);
  for (auto it = problems.rbegin(); it != problems.rend(); ++it) {
    r.error = r.error.empty() ? *it : *it + "; " + r.error;
  }
  r.ok = r.error.empty();
  return r;
}

void Round::analyse(RoundResult& r, int64_t go_ns) const {
  std::vector<std::string> errors;
  int teardown_failures = 0;
  for (const Agent& a : agents_) {
    if (!a.error.empty()) {
      errors.push_back(a.error);
    }
    teardown_failures += a.teardown_failed ? 1 : 0;
  }
  if (!errors.empty()) {
    r.unknown_backend =
        errors.front().find("unknown rendezvous backend") != std::string::npos;
    // Each distinct message once, with how many agents had it.
    std::map<std::string, int> counts;
    for (const auto& e : errors) {
      ++counts[e];
    }
    std::vector<std::string> parts;
    for (const auto& [e, k] : counts) {
      parts.push_back(fmt::format("{} x \"{}\"", k, e));
    }
    constexpr size_t kShown = 3;
    if (parts.size() > kShown) {
      size_t more = parts.size() - kShown;
      parts.resize(kShown);
      parts.push_back(fmt::format("{} more distinct errors", more));
    }
    r.error = fmt::format(
        "{} of {} agents failed: {}", errors.size(), o_.n, join(parts, "; "));
    return;
  }
  if (cancel_) {
    return;  // the caller's problems say why
  }
  std::vector<double> returns;
  std::vector<int> holders(static_cast<size_t>(o_.n), 0);
  std::vector<std::string> wrong;
  for (const Agent& a : agents_) {
    returns.push_back(seconds_between(go_ns, a.done_ns));
    if (a.rank < 0 || a.rank >= o_.n) {
      wrong.push_back(fmt::format("rank {} out of range", a.rank));
    } else {
      ++holders[static_cast<size_t>(a.rank)];
    }
    if (a.world_size != o_.n) {
      wrong.push_back(fmt::format("world_size {}", a.world_size));
    }
    if (a.round != agents_.front().round) {
      wrong.push_back(
          fmt::format("round {} against {}", a.round, agents_.front().round));
    }
  }
  for (int rank = 0; rank < o_.n; ++rank) {
    int h = holders[static_cast<size_t>(rank)];
    if (h != 1) {
      wrong.push_back(fmt::format("rank {} held by {} agents", rank, h));
    }
  }
  if (teardown_failures > 0) {
    wrong.push_back(fmt::format(
        "shutdown() failed on {} of {} agents", teardown_failures, o_.n));
  }
  Stats s = stats(returns);
  r.first_s = s.min;
  r.median_s = s.median;
  r.round_s = s.max;
  r.round = agents_.front().round;
  if (!wrong.empty()) {
    if (wrong.size() > 5) {
      size_t more = wrong.size() - 5;
      wrong.resize(5);
      wrong.push_back(fmt::format("{} more", more));
    }
    r.error = "the round is inconsistent: " + join(wrong, "; ");
  }
}

}  // namespace

RoundResult run_round(const RoundOptions& o) {
  Round round(o);
  return round.run();
}

int thread_count() {
  std::ifstream f("/proc/self/status");
  constexpr std::string_view kKey = "Threads:";
  for (std::string line; std::getline(f, line);) {
    if (line.starts_with(kKey)) {
      return std::stoi(line.substr(kKey.size()));
    }
  }
  return -1;
}

}  // namespace tide::bench
