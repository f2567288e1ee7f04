#include "tide/rendezvous/dynamic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/events/events.h"

#include "net/socket.h"
#include "rendezvous/dynamic_records.h"
#include "rendezvous/keep_alive.h"
#include "rendezvous/rank_order.h"

namespace tide::rendezvous {

using detail::decode_master;
using detail::decode_size;
using detail::decode_state;
using detail::encode_size;
using detail::encode_state;
using detail::JobState;
using detail::Watch;

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

int64_t ms(milliseconds d) {
  return d.count();
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

std::optional<std::vector<std::string>> RendezvousBackend::participants(
    int64_t /*round*/, int64_t /*count*/, milliseconds /*timeout*/) {
  throw InvalidArgument(
      "this rendezvous backend cannot list a round's participants, which "
      "every rank order but arrival needs; use --rank-order=arrival, or "
      "implement RendezvousBackend::participants");
}

std::string NodeDesc::to_string() const {
  return addr + "_" + std::to_string(pid) + "_" + std::to_string(local_id);
}

NodeDesc NodeDesc::make(const std::string& addr) {
  static std::atomic<int64_t> next{0};
  return NodeDesc{
      .addr = addr, .pid = ::getpid(), .local_id = next++, .host = host_name()};
}

DynamicRendezvousSettings DynamicRendezvousSettings::from(
    const RendezvousParameters& p) {
  DynamicRendezvousSettings s;
  s.run_id = p.run_id;
  s.min_nodes = p.min_nodes;
  s.max_nodes = p.max_nodes;
  // torch's etcd backend calls the join deadline "timeout".
  s.join_timeout = p.get_as_seconds(
      "join_timeout", p.get_as_seconds("timeout", s.join_timeout));
  s.last_call_timeout =
      p.get_as_seconds("last_call_timeout", s.last_call_timeout);
  s.close_timeout = p.get_as_seconds("close_timeout", s.close_timeout);
  s.keep_alive_interval =
      p.get_as_seconds("keep_alive_interval", s.keep_alive_interval);
  s.keep_alive_max_attempt = static_cast<int>(
      p.get_as_int("keep_alive_max_attempt", s.keep_alive_max_attempt));
  s.rank_order = parse_rank_order(p.get("rank_order", "arrival"));
  if (p.config.count("node_rank") != 0) {
    int64_t rank = p.get_as_int("node_rank", 0);
    if (rank < 0 || rank > std::numeric_limits<int>::max()) {
      throw InvalidArgument(
          "rendezvous config node_rank=" + p.get("node_rank") +
          " is not a node rank (an integer >= 0)");
    }
    s.node_rank = static_cast<int>(rank);
  }
  if (s.min_nodes < 1 || s.max_nodes < s.min_nodes) {
    throw InvalidArgument(
        "--nnodes " + std::to_string(s.min_nodes) + ":" +
        std::to_string(s.max_nodes) + ": need 1 <= min_nodes <= max_nodes");
  }
  if (s.run_id.empty()) {
    throw InvalidArgument("the dynamic rendezvous needs a run id (--rdzv-id)");
  }
  if (s.keep_alive_interval.count() <= 0 || s.keep_alive_max_attempt < 1) {
    throw InvalidArgument(
        "keep_alive_interval must be > 0 and keep_alive_max_attempt >= 1");
  }
  if (s.join_timeout.count() <= 0) {
    throw InvalidArgument("join_timeout must be > 0");
  }
  return s;
}

struct DynamicRendezvousHandler::Impl {
  DynamicRendezvousHandler& self;
  std::unique_ptr<RendezvousBackend> backend;
  // One next_rendezvous at a time. The backend itself is thread safe, so
  // set_closed() and shutdown() never wait for a round to form.
  std::mutex mutex;
  std::atomic<int64_t> round{-1};
  std::atomic<int64_t> index{0};
  std::atomic<int64_t> size{0};
  std::atomic<bool> interrupted{false};

  // Every wait is a slice of at most one keep-alive interval, so a stop
  // request is seen within one.
  void check_interrupt() const {
    if (interrupted) {
      throw RendezvousError(
          "the rendezvous of run \"" + self.settings_.run_id +
          "\" was interrupted (this agent is stopping)");
    }
  }
  // The running round's watch and its thread; other threads read it
  // through current().
  std::mutex watch_mutex;
  std::shared_ptr<Watch> watch;
  std::thread watch_thread;

  std::shared_ptr<Watch> current() {
    std::lock_guard lock(watch_mutex);
    return watch;
  }
  std::atomic<bool> closed{false};

  JobState read_or_create_state();
  // Throws RendezvousClosedError once the job is closed.
  void throw_if_closed();
  void bump_round(int64_t completed);
  int64_t await_size(int64_t r, int64_t arrival, Clock::time_point deadline);
  int64_t close_round(int64_t r, int64_t size);
  void wait_as_spare(int64_t full_round);
  // This participant's rank in round r (of size participants) in the
  // settings' rank order; nullopt when a participant never wrote its
  // descriptor (it died as it arrived: the round cannot complete).
  std::optional<std::pair<int64_t, RankOrder>> place(
      int64_t r, int64_t arrival, int64_t size);
  // Marks the job closed (failed: running agents stop too).
  void close(bool failed);
  void start_watch(int64_t r, int64_t arrival, int64_t size, int rank);
  void stop_watch(bool wait);
  void event(
      const std::string& message,
      events::NodeState state,
      std::optional<int> rank = std::nullopt);
};

void DynamicRendezvousHandler::Impl::event(
    const std::string& message,
    events::NodeState state,
    std::optional<int> rank) {
  TIDE_LOG_INFO("[rendezvous {}] {}", self.settings_.run_id, message);
  if (!events::enabled()) {
    return;
  }
  events::record_rdzv_event(events::RdzvEvent{
      .name = "DynamicRendezvousHandler.next_rendezvous",
      .run_id = self.settings_.run_id,
      .message = message,
      .hostname = fqdn(),
      .pid = ::getpid(),
      .node_state = state,
      .rank = rank,
      .local_id = self.self_.to_string(),
  });
}

JobState DynamicRendezvousHandler::Impl::read_or_create_state() {
  const std::string& run_id = self.settings_.run_id;
  std::optional<std::string> text = backend->get_state();
  if (!text) {
    text = backend->compare_set_state(
        std::nullopt, encode_state(run_id, JobState{}));
  }
  return decode_state(run_id, *text);
}

void DynamicRendezvousHandler::Impl::throw_if_closed() {
  if (read_or_create_state().closed) {
    throw RendezvousClosedError(
        "the rendezvous of run \"" + self.settings_.run_id + "\" was closed");
  }
}

void DynamicRendezvousHandler::Impl::bump_round(int64_t completed) {
  // Best effort: later joiners start at the next round. One who reads a
  // stale record arrives late and moves on by itself.
  const std::string& run_id = self.settings_.run_id;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::optional<std::string> text = backend->get_state();
    if (!text) {
      return;
    }
    JobState s = decode_state(run_id, *text);
    if (s.closed || s.round > completed) {
      return;
    }
    s.round = completed + 1;
    std::string want = encode_state(run_id, s);
    if (backend->compare_set_state(text, want) == want) {
      return;
    }
  }
}

int64_t DynamicRendezvousHandler::Impl::close_round(int64_t r, int64_t size) {
  std::string mine = encode_size(size, self.self_);
  std::string held = backend->set_once(r, "size", mine);
  if (held == mine) {
    event(
        "round " + std::to_string(r) + " closed with " + std::to_string(size) +
            " node(s)",
        events::NodeState::kRunning);
  }
  return decode_size(r, held);
}

int64_t DynamicRendezvousHandler::Impl::await_size(
    int64_t r, int64_t arrival, Clock::time_point deadline) {
  const DynamicRendezvousSettings& s = self.settings_;
  std::optional<Clock::time_point> close_at;
  // The slice bounds how long a wait goes without looking at the job.
  const milliseconds slice = std::max(s.keep_alive_interval, milliseconds(100));
  auto left = [](Clock::time_point t) {
    return std::max(
        std::chrono::duration_cast<milliseconds>(t - Clock::now()),
        milliseconds(0));
  };
  for (;;) {
    check_interrupt();
    if (Clock::now() >= deadline) {
      int64_t n = backend->arrivals(r);
      throw RendezvousTimeoutError(
          "round " + std::to_string(r) + " of run \"" + s.run_id +
          "\" did not complete within join_timeout (" +
          std::to_string(ms(s.join_timeout)) + " ms): " + std::to_string(n) +
          " of at least " + std::to_string(s.min_nodes) + " node(s) arrived");
    }
    if (!close_at) {
      if (backend->wait_value(
              r, "last_call", std::min(slice, left(deadline)))) {
        close_at = Clock::now() + s.last_call_timeout;
        continue;
      }
      // Arrivals reached min_nodes but the one who did it died before
      // opening the last call: open it ourselves.
      if (backend->arrivals(r) >= s.min_nodes) {
        backend->set_once(r, "last_call", json{{"opened_by", arrival}}.dump());
      } else {
        throw_if_closed();
      }
      continue;
    }
    // The first arrival closes the round when the last call ends; the
    // others give it one slice more before closing it themselves (it may
    // have died), so that thousands of nodes do not all try at once.
    auto close = arrival == 1 ? *close_at : *close_at + slice;
    auto until = std::min({close, deadline, Clock::now() + slice});
    if (auto size = backend->wait_value(r, "size", left(until))) {
      return decode_size(r, *size);
    }
    if (Clock::now() >= close) {
      int64_t n = std::min<int64_t>(backend->arrivals(r), s.max_nodes);
      return close_round(r, n);
    }
  }
}

void DynamicRendezvousHandler::Impl::wait_as_spare(int64_t full_round) {
  // A hot spare (torch's redundancy list): it must not disturb the full
  // round, so it waits until the next round opens (someone restarts) or
  // the full round's first node is lost (then everyone will restart).
  const DynamicRendezvousSettings& s = self.settings_;
  event(
      "round " + std::to_string(full_round) + " is full (" +
          std::to_string(s.max_nodes) +
          " nodes); waiting as a spare until the next round opens",
      events::NodeState::kInit);
  auto watch_first = backend->monitor(full_round, 0, s);
  auto lost_check = Clock::now() + s.lost_after();
  for (;;) {
    check_interrupt();
    if (watch_first->wait_next_round(s.keep_alive_interval) > 0) {
      return;
    }
    if (Clock::now() >= lost_check && !watch_first->alive(1) &&
        !watch_first->has_left(1)) {
      return;
    }
    throw_if_closed();
  }
}

std::optional<std::pair<int64_t, RankOrder>>
DynamicRendezvousHandler::Impl::place(
    int64_t r, int64_t arrival, int64_t size) {
  const DynamicRendezvousSettings& s = self.settings_;
  if (s.rank_order == RankOrder::kArrival) {
    return std::pair(arrival - 1, RankOrder::kArrival);
  }
  // Each participant wrote its descriptor right after it was counted; one
  // missing for as long as a lost heartbeat died in between.
  auto texts = backend->participants(r, size, s.lost_after());
  if (!texts) {
    event(
        "round " + std::to_string(r) +
            ": not every participant wrote its descriptor within " +
            std::to_string(ms(s.lost_after())) +
            " ms; one died as it arrived, joining the next round",
        events::NodeState::kInit);
    return std::nullopt;
  }
  TIDE_CHECK(static_cast<int64_t>(texts->size()) == size);
  RoundRanks placed = rank_round(r, *texts, s.rank_order);
  if (!placed.mixed.empty()) {
    // Two orders would give two nodes the same rank: end the job rather
    // than run it wrong.
    std::string why = "the nodes of round " + std::to_string(r) + " of run \"" +
                      s.run_id +
                      "\" use different rank orders: this node uses " +
                      std::string(rank_order_name(s.rank_order)) + ", " +
                      placed.mixed + "; give every node the same --rank-order";
    close(/*failed=*/true);
    throw InvalidArgument(why);
  }
  const RankAssignment& ranks = placed.ranks;
  if (!ranks.fallback.empty()) {
    TIDE_LOG_WARN(
        "[rendezvous {}] round {}: cannot order the nodes by node rank ({}); "
        "ranking them by arrival instead",
        s.run_id,
        r,
        ranks.fallback);
    if (events::enabled()) {
      events::record_rdzv_event(events::RdzvEvent{
          .name = "DynamicRendezvousHandler.rank_order_fallback",
          .run_id = s.run_id,
          .message =
              "round " + std::to_string(r) +
              ": node-rank order fell back to arrival order: " + ranks.fallback,
          .hostname = fqdn(),
          .pid = ::getpid(),
          .node_state = events::NodeState::kInit,
          .local_id = self.self_.to_string(),
      });
    }
  }
  return std::pair(ranks.rank_of(arrival), ranks.order);
}

void DynamicRendezvousHandler::Impl::start_watch(
    int64_t r, int64_t arrival, int64_t size, int rank) {
  auto w = std::make_shared<Watch>();
  w->settings = self.settings_;
  w->node = self.self_.to_string();
  w->round = r;
  w->index = arrival;
  w->size = size;
  w->rank = rank;
  w->monitor = backend->monitor(r, arrival, self.settings_);
  std::lock_guard lock(watch_mutex);
  watch = w;
  watch_thread = std::thread([w] { w->run(); });
}

void DynamicRendezvousHandler::Impl::stop_watch(bool wait) {
  std::shared_ptr<Watch> w;
  std::thread t;
  {
    std::lock_guard lock(watch_mutex);
    w = std::move(watch);
    t = std::move(watch_thread);
  }
  if (!w) {
    return;
  }
  {
    std::lock_guard lock(w->mutex);
    w->stop = true;
  }
  w->cv.notify_all();
  if (wait) {
    t.join();
  } else {
    // A wait on the backend may take up to one keep-alive interval to
    // return; the thread owns what it uses and ends by itself.
    t.detach();
  }
}

DynamicRendezvousHandler::DynamicRendezvousHandler(
    std::string backend_name,
    std::unique_ptr<RendezvousBackend> backend,
    DynamicRendezvousSettings settings,
    NodeDesc self)
    : backend_name_(std::move(backend_name)),
      settings_(std::move(settings)),
      self_(std::move(self)),
      impl_(new Impl{.self = *this, .backend = std::move(backend)}) {}

DynamicRendezvousHandler::~DynamicRendezvousHandler() {
  impl_->stop_watch(false);
}

RendezvousInfo DynamicRendezvousHandler::next_rendezvous() {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  const DynamicRendezvousSettings& s = settings_;
  auto start = Clock::now();
  auto deadline = start + s.join_timeout;
  int64_t r = m.round + 1;
  try {
    JobState state = m.read_or_create_state();
    if (state.closed) {
      m.stop_watch(false);
      throw RendezvousClosedError(
          "the rendezvous of run \"" + s.run_id +
          "\" is closed (the job finished, or an agent failed for good); a "
          "new job needs another --rdzv-id");
    }
    r = std::max(state.round, m.round + 1);
    if (r > m.round + 1) {
      // A newcomer. When the round before is full and running, it waits as a
      // spare rather than opening a round that would restart everyone.
      auto prev = m.backend->get_value(r - 1, "size");
      if (prev && decode_size(r - 1, *prev) >= s.max_nodes &&
          m.backend->arrivals(r) == 0) {
        m.wait_as_spare(r - 1);
        deadline = Clock::now() + s.join_timeout;
      }
    }
    std::string node = encode_descriptor(self_, s);
    int64_t arrival = 0;
    int64_t size = 0;
    int64_t rank = 0;
    RankOrder order = RankOrder::kArrival;
    BootstrapStoreInfo master;
    for (;;) {
      arrival = m.backend->join(r, node);
      // Our arrival wakes the old round's keep-alive thread if it was
      // waiting for this round to open.
      m.stop_watch(true);
      m.event(
          "joined round " + std::to_string(r) + " as arrival " +
              std::to_string(arrival) + " (nodes " +
              std::to_string(s.min_nodes) + ":" + std::to_string(s.max_nodes) +
              ")",
          events::NodeState::kInit);
      if (arrival == s.min_nodes) {
        m.backend->set_once(
            r, "last_call", json{{"opened_by", arrival}}.dump());
        if (s.max_nodes > s.min_nodes) {
          m.event(
              "round " + std::to_string(r) + ": " +
                  std::to_string(s.min_nodes) + " node(s) in, last call for " +
                  std::to_string(ms(s.last_call_timeout)) + " ms",
              events::NodeState::kInit);
        }
      }
      if (arrival == s.max_nodes) {
        size = m.close_round(r, s.max_nodes);
      } else {
        size = m.await_size(r, arrival, deadline);
      }
      if (arrival <= size) {
        if (auto placed = m.place(r, arrival, size)) {
          std::tie(rank, order) = *placed;
          if (rank == 0) {
            // Its address and a free port there are the workers'
            // MASTER_ADDR:MASTER_PORT (global rank 0's worker hosts their
            // store there).
            std::string mine =
                detail::encode_master(self_.addr, net::free_port());
            master = decode_master(r, m.backend->set_once(r, "master", mine));
            m.bump_round(r);
            break;
          }
          // Rank 0 publishes at once; silence for as long as a lost
          // heartbeat means it died after arriving. The round cannot work
          // without it: everyone moves on to the next one.
          if (auto text = m.backend->wait_value(r, "master", s.lost_after())) {
            master = decode_master(r, *text);
            break;
          }
          m.event(
              "round " + std::to_string(r) +
                  ": rank 0 did not publish the workers' address within " +
                  std::to_string(ms(s.lost_after())) +
                  " ms; it is presumed dead, joining the next round",
              events::NodeState::kInit);
        }
      } else if (size >= s.max_nodes) {
        m.wait_as_spare(r);
        deadline = Clock::now() + s.join_timeout;
      } else {
        m.event(
            "arrived after round " + std::to_string(r) + " closed at " +
                std::to_string(size) +
                " node(s); joining the next round (the running nodes will "
                "restart to admit this one)",
            events::NodeState::kInit);
      }
      ++r;
    }
    m.round = r;
    m.index = arrival;
    m.size = size;
    m.start_watch(r, arrival, size, static_cast<int>(rank));
    m.event(
        "round " + std::to_string(r) + " complete: rank " +
            std::to_string(rank) + " of " + std::to_string(size) + " (" +
            std::string(rank_order_name(order)) + " order) in " +
            std::to_string(ms(std::chrono::duration_cast<milliseconds>(
                Clock::now() - start))) +
            " ms",
        events::NodeState::kRunning,
        static_cast<int>(rank));
    return RendezvousInfo{
        .store = m.backend->round_store(r),
        .rank = static_cast<int>(rank),
        .world_size = static_cast<int>(size),
        .bootstrap = master,
        .round = r,
    };
  } catch (const NetworkError& e) {
    throw RendezvousConnectionError(
        "lost the rendezvous backend in round " + std::to_string(r) + ": " +
        e.what());
  } catch (const RendezvousError&) {
    throw;
  } catch (const TimeoutError& e) {
    throw RendezvousConnectionError(
        "the rendezvous backend did not answer in round " + std::to_string(r) +
        ": " + e.what());
  }
}

bool DynamicRendezvousHandler::is_closed() {
  if (impl_->closed) {
    return true;
  }
  if (auto w = impl_->current(); w && w->closed) {
    return true;
  }
  return impl_->read_or_create_state().closed;
}

void DynamicRendezvousHandler::Impl::close(bool failed) {
  const DynamicRendezvousSettings& s = self.settings_;
  auto deadline = Clock::now() + s.close_timeout;
  while (Clock::now() < deadline) {
    std::optional<std::string> text = backend->get_state();
    JobState job = text ? decode_state(s.run_id, *text) : JobState{};
    if (job.closed) {
      break;
    }
    job.closed = true;
    job.failed = failed;
    std::string want = encode_state(s.run_id, job);
    if (backend->compare_set_state(text, want) == want) {
      event(
          failed ? "closed the rendezvous: this agent failed for good; the "
                   "others stop"
                 : "closed the rendezvous: this agent finished",
          failed ? events::NodeState::kFailed : events::NodeState::kSucceeded);
      break;
    }
  }
  closed = true;
}

void DynamicRendezvousHandler::set_closed() {
  impl_->close(/*failed=*/true);
}

int DynamicRendezvousHandler::num_nodes_waiting() {
  std::shared_ptr<Watch> w = impl_->current();
  if (!w) {
    return 0;
  }
  {
    std::lock_guard lock(w->error_mutex);
    if (!w->unreachable.empty()) {
      throw RendezvousConnectionError(
          "lost the rendezvous backend of run \"" + settings_.run_id +
          "\": " + w->unreachable);
    }
  }
  if (w->closed) {
    throw RendezvousClosedError(
        "another node closed the rendezvous of run \"" + settings_.run_id +
        "\" (it finished, or failed for good)");
  }
  return static_cast<int>(w->waiting + (w->lost != 0 ? 1 : 0));
}

bool DynamicRendezvousHandler::shutdown() {
  try {
    bool gone = false;
    if (auto w = impl_->current()) {
      std::lock_guard lock(w->error_mutex);
      gone = !w->unreachable.empty();
    }
    impl_->stop_watch(false);
    if (gone) {
      return false;  // nothing to tell a backend that is gone
    }
    impl_->backend->set_timeout(settings_.lost_after());
    // Closing first ends the job for newcomers (and, when this agent
    // failed, already told the others to stop), so an agent hosting the
    // store does not wait for them in vain.
    impl_->close(/*failed=*/false);
    if (impl_->round >= 0) {
      DynamicRendezvousSettings s = settings_;
      if (impl_->interrupted) {
        // A stop was requested: a store served from here stops now instead
        // of waiting for the other nodes to leave.
        s.close_timeout = milliseconds(0);
      }
      impl_->backend->leave(impl_->round, impl_->index, impl_->size, s);
    }
    return true;
  } catch (const Error& e) {
    TIDE_LOG_WARN(
        "[rendezvous {}] shutdown failed: {}", settings_.run_id, e.what());
    return false;
  }
}

std::shared_ptr<store::Store> DynamicRendezvousHandler::open_job_store() {
  return impl_->backend->open_job_store();
}

void DynamicRendezvousHandler::interrupt() noexcept {
  impl_->interrupted = true;
}

}  // namespace tide::rendezvous
