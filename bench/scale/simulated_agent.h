#pragma once

#include <coroutine>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "rendezvous/store_keys.h"
#include "sim.h"

// Simulated agents of tide's c10d rendezvous: each is two coroutines on a
// sim::Loop, the handler's (DynamicRendezvousHandler::next_rendezvous over
// the c10d StoreBackend) and its keep-alive's (Watch::run over
// StoreRoundMonitor), sending the same store requests in the same order on
// the agent's one connection, in tagged frames as its MuxStore does.
// src/rendezvous/ is the reference: a change there needs its mirror here, and
// the suite's run with real handlers among the simulated ones fails when the
// two disagree.
namespace tide::bench::scale {

using sim::Co;

constexpr int64_t kMs = 1'000'000;
// StoreRoundMonitor's bound on one wait for the next round.
constexpr int64_t kNextRoundWaitMs = 60'000;

// What the simulated agents share with the real ones and the controller.
struct Settings {
  std::string run_id;
  int64_t min_nodes = 1;
  int64_t max_nodes = 1;
  int64_t keep_alive_ns = 1000 * kMs;
  int64_t max_attempts = 3;
  int64_t last_call_ns = 1000 * kMs;
  int64_t join_timeout_ns = 120'000 * kMs;
  int64_t read_timeout_ns = 120'000 * kMs;
  int64_t monitor_interval_ns = 100 * kMs;
  int64_t lost_after_ns() const {
    return keep_alive_ns * max_attempts;
  }
};

// Every completed round of every agent, simulated or real; thread safe.
class Tally {
 public:
  struct Round {
    int64_t size = 0;
    int64_t count = 0;
    int64_t last_ns = 0;
    std::vector<bool> ranks;
  };

  void complete(int64_t round, int64_t rank, int64_t size, int64_t at_ns) {
    std::lock_guard lock(mutex_);
    Round& r = rounds_[round];
    if (r.count == 0) {
      r.size = size;
      r.ranks.assign(static_cast<size_t>(std::max<int64_t>(size, 1)), false);
    }
    if (size != r.size) {
      error_ = fmt::format(
          "round {}: world sizes {} and {} in one round", round, r.size, size);
    } else if (rank < 0 || rank >= size || r.ranks[static_cast<size_t>(rank)]) {
      error_ = fmt::format(
          "round {}: rank {} twice or out of 0..{}", round, rank, size - 1);
    } else {
      r.ranks[static_cast<size_t>(rank)] = true;
    }
    ++r.count;
    r.last_ns = std::max(r.last_ns, at_ns);
  }
  // When the last of `count` agents completed a round of that size (the
  // latest such round), if one has.
  std::optional<int64_t> complete_round(int64_t count) {
    std::lock_guard lock(mutex_);
    for (auto it = rounds_.rbegin(); it != rounds_.rend(); ++it) {
      if (it->second.count >= count && it->second.size == count) {
        return it->second.last_ns;
      }
    }
    return std::nullopt;
  }
  std::string error() {
    std::lock_guard lock(mutex_);
    return error_;
  }
  void fail(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (error_.empty()) {
      error_ = why;
    }
  }

 private:
  std::mutex mutex_;
  std::map<int64_t, Round> rounds_;
  std::string error_;
};

struct Agent {
  size_t id = 0;
  // The agent's one connection (tagged frames): the handler's requests and
  // its keep-alive's are in flight on it together.
  std::unique_ptr<sim::Conn> conn;
  // A keep-alive runs; next_rendezvous waits for it to end (joiner), and
  // wakes it where it sleeps (the real thread waits on a condition
  // variable that stop_watch notifies).
  bool watching = false;
  std::coroutine_handle<> joiner;
  std::coroutine_handle<> sleeper;
  sim::Loop::TimerId nap{};
  std::string descriptor;
  int64_t round = -1;
  int64_t index = 0;
  int64_t size = 0;
  // The keep-alive's view, read by the agent's monitor loop.
  int64_t waiting = 0;
  int64_t lost = 0;
  int64_t lost_at_ns = 0;
  // Bumped to end the current keep-alive (stop_watch).
  uint64_t watch = 0;
  // The keep-alive's wait for the next round: at the store; met.
  bool next_wait = false;
  bool next_met = false;
  bool killed = false;
};

struct JobState {
  int64_t round = 0;
  bool closed = false;
  bool failed = false;
};

// The shared state of one simulated job on one loop.
class Job {
 public:
  Job(sim::Loop& loop, Settings s, Tally& tally)
      : loop_(loop), s_(std::move(s)), keys_(s_.run_id), tally_(tally) {}

  // An agent's life: connect, wait for go, then rounds until stopped.
  Co<void> agent_life(Agent& a);
  void go() {
    go_ = true;
  }
  void stop() {
    stop_ = true;
  }
  bool stopping() const {
    return stop_;
  }
  size_t connected() const {
    return connected_;
  }
  std::vector<Agent>& agents() {
    return agents_;
  }
  const Settings& settings() const {
    return s_;
  }

 private:
  Co<std::optional<std::string>> value_if_set(sim::Conn& c, std::string key);
  Co<int64_t> arrivals(sim::Conn& c, int64_t r);
  Co<JobState> read_or_create_state(Agent& a);
  Co<std::string> set_once(
      Agent& a, int64_t r, const std::string& name, std::string value);
  Co<std::optional<std::string>> wait_value(
      Agent& a, int64_t r, const std::string& name, int64_t timeout_ns);
  Co<int64_t> close_round(Agent& a, int64_t r, int64_t size);
  Co<int64_t> await_size(
      Agent& a, int64_t r, int64_t arrival, int64_t deadline);
  Co<void> bump_round(Agent& a, int64_t completed);
  Co<void> next_rendezvous(Agent& a);
  Co<void> keep_alive(Agent& a, uint64_t watch);
  Co<bool> alive(
      Agent& a,
      sim::Conn& conn,
      int64_t index,
      std::map<int64_t, std::pair<int64_t, int64_t>>& seen);
  bool seen_alive(
      int64_t index,
      int64_t beats,
      int64_t asked,
      std::map<int64_t, std::pair<int64_t, int64_t>>& seen) const;
  // The batch of a keep-alive interval (peer 0: no neighbour read).
  std::vector<sim::Conn::Call> tick_calls(const Agent& a, int64_t peer) const;
  Co<void> next_round_wait(Agent& a, uint64_t watch);

  std::string encode_state(const JobState& s) const {
    return nlohmann::json{
        {"schema", "tide.rendezvous/1"},
        {"run_id", s_.run_id},
        {"round", s.round},
        {"closed", s.closed},
        {"failed", s.failed}}
        .dump();
  }
  static JobState decode_state(const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text);
    return JobState{
        .round = j.at("round").get<int64_t>(),
        .closed = j.at("closed").get<bool>(),
        .failed = j.value("failed", false)};
  }

  sim::Loop& loop_;
  const Settings s_;
  const rendezvous::StoreKeys keys_;
  Tally& tally_;
  std::vector<Agent> agents_;
  bool go_ = false;
  bool stop_ = false;
  size_t connected_ = 0;
};

}  // namespace tide::bench::scale
