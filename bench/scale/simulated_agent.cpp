#include "simulated_agent.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "tide/common/error.h"

namespace tide::bench::scale {

namespace {

using nlohmann::json;

// The JSON values, made outside coroutines: GCC 12 miscompiles a braced
// list inside one.
std::string last_call_value(int64_t arrival) {
  return json{{"opened_by", arrival}}.dump();
}

std::vector<std::string> one(std::string key) {
  std::vector<std::string> v;
  v.push_back(std::move(key));
  return v;
}

std::string size_value(const Agent& a, int64_t size) {
  return json{{"size", size}, {"closed_by", "sim_" + std::to_string(a.id)}}
      .dump();
}
std::string master_value(const Agent& a) {
  return json{{"addr", "127.0.0.1"}, {"port", 29500 + (a.id % 1000)}}.dump();
}

}  // namespace

Co<std::optional<std::string>> Job::value_if_set(
    sim::Conn& c, std::string key) {
  // One compare-and-set that writes nothing, as the backend reads.
  const std::string absent(rendezvous::kAbsent);
  std::string v = co_await c.compare_set(std::move(key), absent, absent);
  if (v == absent) {
    co_return std::nullopt;
  }
  co_return v;
}

Co<int64_t> Job::arrivals(sim::Conn& c, int64_t r) {
  auto n = co_await value_if_set(c, keys_.count(r));
  co_return n ? std::stoll(*n) : 0;
}

Co<JobState> Job::read_or_create_state(Agent& a) {
  auto text = co_await value_if_set(*a.conn, keys_.state());
  if (!text) {
    text = co_await a.conn->compare_set(keys_.state(), "", encode_state({}));
  }
  co_return decode_state(*text);
}

Co<std::string> Job::set_once(
    Agent& a, int64_t r, const std::string& name, std::string value) {
  std::string held =
      co_await a.conn->compare_set(keys_.value(r, name), "", std::move(value));
  co_return held;
}

Co<std::optional<std::string>> Job::wait_value(
    Agent& a, int64_t r, const std::string& name, int64_t timeout_ns) {
  std::string key = keys_.value(r, name);
  bool met =
      co_await a.conn->wait(one(key), std::max<int64_t>(timeout_ns, kMs));
  if (!met) {
    co_return std::nullopt;
  }
  std::string value = co_await a.conn->get(key);
  co_return value;
}

Co<int64_t> Job::close_round(Agent& a, int64_t r, int64_t size) {
  std::string held = co_await set_once(a, r, "size", size_value(a, size));
  co_return json::parse(held).at("size").get<int64_t>();
}

Co<int64_t> Job::await_size(
    Agent& a, int64_t r, int64_t arrival, int64_t deadline) {
  std::optional<int64_t> close_at;
  const int64_t slice = std::max<int64_t>(s_.keep_alive_ns, 100 * kMs);
  for (;;) {
    int64_t now = mono_ns();
    if (now >= deadline || stop_) {
      throw TimeoutError(fmt::format("round {} did not complete", r));
    }
    if (!close_at) {
      auto last_call = co_await wait_value(
          a, r, "last_call", std::min(slice, deadline - now));
      if (last_call) {
        close_at = mono_ns() + s_.last_call_ns;
        continue;
      }
      int64_t in = co_await arrivals(*a.conn, r);
      if (in >= s_.min_nodes) {
        co_await set_once(a, r, "last_call", last_call_value(arrival));
      } else {
        co_await read_or_create_state(a);  // throw_if_closed
      }
      continue;
    }
    // The first arrival closes; the others give it a slice more.
    int64_t close = arrival == 1 ? *close_at : *close_at + slice;
    int64_t until = std::min(std::min(close, deadline), now + slice);
    auto size = co_await wait_value(a, r, "size", until - now);
    if (size) {
      co_return json::parse(*size).at("size").get<int64_t>();
    }
    if (mono_ns() >= close) {
      int64_t in = co_await arrivals(*a.conn, r);
      int64_t size = co_await close_round(a, r, std::min(in, s_.max_nodes));
      co_return size;
    }
  }
}

Co<void> Job::bump_round(Agent& a, int64_t completed) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto text = co_await value_if_set(*a.conn, keys_.state());
    if (!text) {
      co_return;
    }
    JobState s = decode_state(*text);
    if (s.closed || s.round > completed) {
      co_return;
    }
    s.round = completed + 1;
    std::string want = encode_state(s);
    std::string now = co_await a.conn->compare_set(keys_.state(), *text, want);
    if (now == want) {
      co_return;
    }
  }
}

Co<void> Job::next_rendezvous(Agent& a) {
  int64_t deadline = mono_ns() + s_.join_timeout_ns;
  JobState state = co_await read_or_create_state(a);
  if (state.closed) {
    throw RendezvousClosedError("the simulated job was closed");
  }
  int64_t r = std::max(state.round, a.round + 1);
  int64_t arrival = 0;
  int64_t size = 0;
  for (;;) {
    arrival = co_await a.conn->add(keys_.count(r), 1);
    co_await a.conn->set(keys_.node(r, arrival), a.descriptor);
    ++a.watch;  // stop_watch(true): the old keep-alive ends, and is joined
    if (a.sleeper) {
      loop_.cancel(a.nap);
      loop_.post(std::exchange(a.sleeper, {}));
    }
    if (a.watching) {
      struct Join {
        Agent& a;
        bool await_ready() const noexcept {
          return !a.watching;
        }
        void await_suspend(std::coroutine_handle<> h) {
          a.joiner = h;
        }
        void await_resume() const noexcept {}
      };
      co_await Join{a};
    }
    if (arrival == s_.min_nodes) {
      co_await set_once(a, r, "last_call", last_call_value(arrival));
    }
    if (arrival == s_.max_nodes) {
      size = co_await close_round(a, r, s_.max_nodes);
    } else {
      size = co_await await_size(a, r, arrival, deadline);
    }
    if (arrival <= size) {
      if (arrival == 1) {  // rank 0, in arrival order
        co_await set_once(a, r, "master", master_value(a));
        co_await bump_round(a, r);
        break;
      }
      auto master = co_await wait_value(a, r, "master", s_.lost_after_ns());
      if (master) {
        break;
      }
    } else if (size >= s_.max_nodes) {
      throw RendezvousError("a simulated agent would be a spare");
    }
    ++r;
  }
  a.round = r;
  a.index = arrival;
  a.size = size;
  a.waiting = 0;
  a.lost = 0;
  tally_.complete(r, arrival - 1, size, mono_ns());
}

bool Job::seen_alive(
    int64_t index,
    int64_t beats,
    int64_t asked,
    std::map<int64_t, std::pair<int64_t, int64_t>>& seen) const {
  auto [it, fresh] = seen.try_emplace(index, beats, asked);
  if (fresh || it->second.first != beats) {
    it->second = {beats, asked};
    return true;
  }
  return asked - it->second.second < s_.lost_after_ns();
}

Co<bool> Job::alive(
    Agent& a,
    sim::Conn& conn,
    int64_t index,
    std::map<int64_t, std::pair<int64_t, int64_t>>& seen) {
  int64_t asked = mono_ns();
  int64_t beats = co_await conn.add(keys_.heartbeat(a.round, index), 0);
  co_return seen_alive(index, beats, asked, seen);
}

std::vector<sim::Conn::Call> Job::tick_calls(
    const Agent& a, int64_t peer) const {
  std::vector<sim::Conn::Call> calls(peer > 0 ? 3 : 2);
  calls[0] = {
      .add = true, .key = keys_.heartbeat(a.round, a.index), .delta = 1};
  calls[1] = {
      .key = keys_.state(),
      .expected = std::string(rendezvous::kAbsent),
      .desired = std::string(rendezvous::kAbsent)};
  if (peer > 0) {
    calls[2] = {.add = true, .key = keys_.heartbeat(a.round, peer)};
  }
  return calls;
}

Co<void> Job::next_round_wait(Agent& a, uint64_t watch) {
  // StoreRoundMonitor::wait_next_round: one wait that stays at the store
  // across intervals.
  bool met = false;
  try {
    met = co_await a.conn->wait(
        one(keys_.count(a.round + 1)), kNextRoundWaitMs * kMs);
  } catch (const Error&) {
    // Asked again at the next interval, as the real one is.
  }
  if (a.watch != watch) {
    co_return;  // that round's keep-alive has ended
  }
  a.next_wait = false;
  if (met) {
    a.next_met = true;
    if (a.sleeper) {
      loop_.cancel(a.nap);
      loop_.post(std::exchange(a.sleeper, {}));
    }
  }
}

// StoreRoundMonitor and Watch::run: each interval the heartbeat, the job
// record and the neighbour's heartbeat in one batch; a wait for the next
// round's first arrival stays at the store meanwhile.
Co<void> Job::keep_alive(Agent& a, uint64_t watch) {
  struct Running {  // stop_watch(true) joins the thread: a.joiner waits
    Job& job;
    Agent& a;
    ~Running() {
      a.watching = false;
      if (a.joiner) {
        job.loop_.post(std::exchange(a.joiner, {}));
      }
    }
  } running{*this, a};
  a.watching = true;
  a.next_wait = false;
  a.next_met = false;
  sim::Conn& conn = *a.conn;  // the agent's one connection
  const int64_t r = a.round;
  auto next_peer = [&](int64_t after) { return after % a.size + 1; };
  int64_t peer = a.size > 1 ? next_peer(a.index) : a.index;
  int64_t started = mono_ns();
  int64_t next_beat = started;
  int failures = 0;
  std::map<int64_t, std::pair<int64_t, int64_t>> seen;
  while (a.watch == watch && !a.killed && !stop_) {
    std::string error;
    try {
      if (mono_ns() >= next_beat) {
        next_beat = mono_ns() + s_.keep_alive_ns;
        bool check = a.lost == 0 && a.waiting == 0 && peer != a.index;
        int64_t asked = mono_ns();
        auto results = co_await conn.together(tick_calls(a, check ? peer : 0));
        if (results[1].value != rendezvous::kAbsent) {
          decode_state(results[1].value);
        }
        bool up = !check || seen_alive(peer, results[2].number, asked, seen);
        if (!up && mono_ns() >= started + s_.lost_after_ns()) {
          // check_neighbour
          for (int64_t seen_n = 0; peer != a.index && seen_n < a.size;
               ++seen_n) {
            if (seen_n > 0) {
              up = co_await alive(a, conn, peer, seen);
              if (up) {
                break;
              }
            }
            bool left = co_await conn.check(one(keys_.left(r, peer)));
            if (!left) {
              a.lost = peer;
              a.lost_at_ns = mono_ns();
              break;
            }
            peer = next_peer(peer);
          }
        }
        failures = 0;
      }
      if (a.watch != watch || a.killed || stop_) {
        break;
      }
      if (a.waiting == 0 && a.next_met) {
        a.waiting = co_await arrivals(conn, r + 1);
        continue;
      }
      if (a.waiting == 0 && !a.next_wait) {
        a.next_wait = true;
        loop_.spawn(next_round_wait(a, watch));
      }
    } catch (const Error& e) {
      error = e.what();
    }
    if (!error.empty() && ++failures >= s_.max_attempts && !stop_) {
      throw NetworkError(fmt::format(
          "the store is unreachable ({} keep-alive attempts failed): {}",
          failures,
          error));
    }
    struct Nap {
      sim::Loop& loop;
      Agent& a;
      int64_t at;
      bool await_ready() const noexcept {
        return false;
      }
      void await_suspend(std::coroutine_handle<> h) {
        a.sleeper = h;
        a.nap = loop.at(at, [&a = a] {
          if (auto s = std::exchange(a.sleeper, {})) {
            s.resume();
          }
        });
      }
      void await_resume() const noexcept {}
    };
    co_await Nap{loop_, a, next_beat};
  }
}

Co<void> Job::agent_life(Agent& a) {
  co_await a.conn->connect();
  ++connected_;
  while (!go_ && !stop_) {
    co_await loop_.sleep_until(mono_ns() + 5 * kMs);
  }
  while (!stop_ && !a.killed) {
    co_await next_rendezvous(a);
    loop_.spawn(keep_alive(a, a.watch), [this, &a](std::exception_ptr e) {
      if (e && !stop_ && !a.killed) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          tally_.fail(std::string("a keep-alive failed: ") + x.what());
        }
      }
    });
    // The agent's monitor loop: num_nodes_waiting() every monitor_interval.
    while (!stop_ && !a.killed && a.waiting == 0 && a.lost == 0) {
      co_await loop_.sleep_until(mono_ns() + s_.monitor_interval_ns);
    }
  }
}

// ---------------------------------------------------------------------------

}  // namespace tide::bench::scale
