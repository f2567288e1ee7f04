#include "agent/status_publisher.h"

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "common/clock.h"

namespace tide::agent::detail {

using status::NodeStatus;
using status::StatusBoard;

StatusPublisher::StatusPublisher(
    std::function<std::shared_ptr<store::Store>()> open)
    : open_(std::move(open)),
      thread_([this](std::stop_token stop) { run(stop); }) {}

StatusPublisher::~StatusPublisher() {
  thread_.request_stop();
  thread_.join();
}

void StatusPublisher::post(NodeStatus snapshot, bool urgent, bool leader) {
  {
    std::lock_guard lock(mutex_);
    if (fresh_ && latest_->state != snapshot.state) {
      // The last snapshot of its state: written before the new one.
      if (queued_.size() == kMaxQueued) {
        queued_.pop_front();
      }
      queued_.push_back(std::move(*latest_));
    }
    latest_ = std::move(snapshot);
    fresh_ = true;
    urgent_ = urgent_ || urgent;
    leader_ = leader;
    ++generation_;
  }
  changed_.notify_one();
}

std::optional<double> StatusPublisher::fastest_step_time() const {
  std::lock_guard lock(mutex_);
  return fastest_;
}

void StatusPublisher::run(std::stop_token stop) {
  std::optional<Clock::time_point> last_write;
  for (;;) {
    NodeStatus snapshot;
    bool leader = false;
    {
      std::unique_lock lock(mutex_);
      for (;;) {
        uint64_t seen = generation_;
        auto posted = [&] { return generation_ != seen; };
        if (stop.stop_requested()) {
          queued_.clear();  // one write at most, bounded by the timeout
          if (!fresh_) {
            return;
          }
          break;  // the last snapshot, at once
        }
        if (!queued_.empty()) {
          break;  // a state entered and not yet written: at once
        }
        if (!latest_) {
          changed_.wait(lock, stop, posted);
          continue;
        }
        // The last snapshot is written again each interval (with the time
        // of writing), so a node whose agent is busy elsewhere (a long
        // rendezvous, the exit barrier) does not look silent.
        auto interval = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(latest_->interval));
        auto due = !last_write || latest_->state != written_state_
                       ? Clock::now()
                       : *last_write +
                             (urgent_ ? interval / kUrgentFraction : interval);
        if (Clock::now() >= due) {
          break;
        }
        changed_.wait_until(lock, stop, due, posted);
      }
      if (!queued_.empty()) {
        snapshot = std::move(queued_.front());
        queued_.pop_front();
      } else {
        snapshot = *latest_;
        fresh_ = false;
        urgent_ = false;
      }
      leader = leader_;
    }
    last_write = Clock::now();
    snapshot.updated_at = now_seconds();
    written_state_ = snapshot.state;
    if (!stopped_) {
      publish_once(std::move(snapshot), leader);
    }
  }
}

void StatusPublisher::publish_once(NodeStatus s, bool leader) {
  try {
    if (!board_) {
      store_ = open_();
      if (!store_) {
        stopped_ = true;
        TIDE_LOG_DEBUG(
            "the rendezvous backend keeps no job store: no status records");
        return;
      }
      auto board = std::make_unique<StatusBoard>(*store_);
      slot_ = board->claim_slot();
      board_ = std::move(board);
      TIDE_LOG_DEBUG("status records in slot {} of the job store", slot_);
    }
    s.slot = slot_;
    std::string attempts = status::attempts_to_json(s.attempts);
    board_->publish(s, attempts != last_attempts_);
    last_attempts_ = std::move(attempts);
    // The figure changes slowly: the leader makes it, and a follower reads
    // it, at one write in kFigureEvery.
    std::optional<std::optional<double>> fastest;
    bool read_figure = writes_++ % kFigureEvery == 0;
    if (leader && read_figure) {
      double now = now_seconds();
      std::vector<NodeStatus> live;
      for (auto& r : board_->read()) {
        if (now - r.updated_at > status::expires_after(r)) {
          board_->retire(r.slot);
        } else if (now - r.updated_at <= status::silent_after(r)) {
          live.push_back(std::move(r));
        }
      }
      fastest = status::fastest_step_time(live);
      board_->set_fastest_step_time(*fastest);
    } else if (read_figure) {
      fastest = board_->fastest_step_time();
    }
    if (fastest) {
      std::lock_guard lock(mutex_);
      fastest_ = *fastest;
    }
    if (!last_error_.empty()) {
      TIDE_LOG_INFO("status records: the job store answers again");
      last_error_.clear();
    }
  } catch (const std::exception& e) {
    // Logged once per kind of failure; tried again next interval.
    if (last_error_ != e.what()) {
      last_error_ = e.what();
      TIDE_LOG_WARN(
          "status records: cannot write to the job store ({}); retrying "
          "every {:g} s",
          e.what(),
          s.interval);
    }
  }
}

}  // namespace tide::agent::detail
