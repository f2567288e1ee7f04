// The watchdog: one thread that sleeps until the next deadline, a request or
// max_interval, whichever comes first.
#include "tide/timer/timer_server.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "tide/common/logging.h"

namespace tide::timer {

TimerServer::TimerServer(TimerServerOptions options)
    : options_(std::move(options)) {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) {
    throw Error(
        std::string("timer server: eventfd failed: ") + std::strerror(errno));
  }
  last_progress_ = now();
}

TimerServer::~TimerServer() {
  stop();
}

void TimerServer::start() {
  std::call_once(start_once_, [this] {
    thread_ = std::thread([this] { watchdog(); });
    event("watchdog started", {});
  });
}

void TimerServer::stop() {
  if (stopping_.exchange(true)) {
    return;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  if (thread_.joinable()) {
    thread_.join();
    event("watchdog stopped", {});
  }
}

void TimerServer::event(const char* name, const TimerRequest& r) const {
  if (options_.log_event) {
    options_.log_event(name, r);
  }
}

bool TimerServer::allowed(pid_t pid) const {
  if (pid <= 0 || pid == self_pid_) {
    return false;
  }
  return !options_.allow_pid || options_.allow_pid(pid);
}

size_t TimerServer::apply_locked(const TimerRequest& r) {
  auto key = std::make_pair(r.worker_id, r.scope_id);
  auto it = timers_.find(key);
  if (it != timers_.end()) {
    deadlines_.erase({it->second.expiration_time, r.worker_id, r.scope_id});
    timers_.erase(it);
  }
  if (r.expiration_time < 0) {
    return 1;
  }
  if (!allowed(r.worker_id)) {
    TIDE_LOG_WARN(
        "[timer] refusing a timer for pid {} (scope \"{}\"): not a worker of "
        "this "
        "server",
        r.worker_id,
        r.scope_id);
    return 0;
  }
  if (r.signal <= 0 || r.signal >= NSIG || !std::isfinite(r.expiration_time)) {
    TIDE_LOG_WARN(
        "[timer] refusing a timer for pid {} (scope \"{}\"): signal {} or "
        "expiration {} "
        "is invalid",
        r.worker_id,
        r.scope_id,
        r.signal,
        r.expiration_time);
    return 0;
  }
  timers_.emplace(key, r);
  deadlines_.emplace(r.expiration_time, r.worker_id, r.scope_id);
  return 1;
}

size_t TimerServer::register_timers(const std::vector<TimerRequest>& requests) {
  size_t accepted = 0;
  {
    std::lock_guard lock(mutex_);
    for (const auto& r : requests) {
      accepted += apply_locked(r);
    }
  }
  for (const auto& r : requests) {
    event(r.expiration_time < 0 ? "clear timer" : "set timer", r);
  }
  last_progress_ = now();
  // The next deadline may have moved earlier.
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  return accepted;
}

void TimerServer::clear_timers(const std::set<pid_t>& worker_ids) {
  std::lock_guard lock(mutex_);
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (worker_ids.count(it->first.first)) {
      deadlines_.erase(
          {it->second.expiration_time, it->first.first, it->first.second});
      it = timers_.erase(it);
    } else {
      ++it;
    }
  }
}

std::map<pid_t, std::vector<TimerRequest>> TimerServer::get_expired_timers(
    double deadline) const {
  std::map<pid_t, std::vector<TimerRequest>> out;
  std::lock_guard lock(mutex_);
  for (const auto& [expiration, pid, scope] : deadlines_) {
    if (expiration > deadline) {
      break;
    }
    out[pid].push_back(timers_.at({pid, scope}));
  }
  return out;
}

size_t TimerServer::size() const {
  std::lock_guard lock(mutex_);
  return timers_.size();
}

double TimerServer::last_progress_time() const {
  return last_progress_.load();
}

void TimerServer::reap(double t) {
  auto expired = get_expired_timers(t);
  if (expired.empty()) {
    return;
  }
  log_debug_info_for_expired_timers(options_.run_id, expired);
  std::set<pid_t> done;
  for (const auto& [pid, timers] : expired) {
    done.insert(pid);
    // The earliest expired timer with a signal decides (torch's rule).
    const TimerRequest* first = nullptr;
    for (const auto& r : timers) {
      if (r.signal > 0) {
        first = &r;
        break;
      }
    }
    if (first == nullptr) {
      continue;
    }
    event("timer expired", *first);
    if (!allowed(pid)) {
      TIDE_LOG_ERROR(
          "[timer] not signalling pid {}: not a worker of this server", pid);
      continue;
    }
    ExpiredTimer e{
        .worker_id = pid,
        .scope_id = first->scope_id,
        .expiration_time = first->expiration_time,
        .signal = first->signal,
        .overrun_seconds = t - first->expiration_time,
    };
    // Forgotten and told before the signal goes out, so whoever sees the
    // worker die already knows why and finds no timer of it left.
    clear_timers({pid});
    if (options_.on_reap) {
      options_.on_reap(e);
    }
    if (::kill(pid, first->signal) != 0) {
      if (errno != ESRCH) {
        TIDE_LOG_ERROR(
            "[timer] could not signal pid {}: {}", pid, std::strerror(errno));
      }
      continue;  // Gone already: nothing to reclaim.
    }
    TIDE_LOG_WARN(
        "[timer] worker pid {} overran timer \"{}\" by {:.3f} s; sent signal "
        "{}",
        pid,
        e.scope_id,
        e.overrun_seconds,
        e.signal);
    event("kill worker process", *first);
  }
  clear_timers(done);
}

void TimerServer::watchdog() {
  std::vector<TimerRequest> batch;
  while (!stopping_.load()) {
    double next = 0;
    {
      std::lock_guard lock(mutex_);
      next = deadlines_.empty() ? HUGE_VAL : std::get<0>(*deadlines_.begin());
    }
    double wait_s = std::min(
        std::chrono::duration<double>(options_.max_interval).count(),
        std::max(0.0, next - now()));
    timespec ts{
        .tv_sec = static_cast<time_t>(wait_s),
        .tv_nsec = static_cast<long>((wait_s - std::floor(wait_s)) * 1e9),
    };
    pollfd fds[2] = {
        {.fd = channel_fd(), .events = POLLIN, .revents = 0},
        {.fd = wake_fd_.get(), .events = POLLIN, .revents = 0},
    };
    int r = ::ppoll(fds, 2, &ts, nullptr);
    if (r < 0 && errno != EINTR) {
      TIDE_LOG_ERROR("[timer] poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &v, sizeof v);
    }
    if (fds[0].revents & POLLIN) {
      batch.clear();
      read_requests(batch);
      if (!batch.empty()) {
        std::lock_guard lock(mutex_);
        for (const auto& req : batch) {
          apply_locked(req);
        }
      }
      for (const auto& req : batch) {
        event(req.expiration_time < 0 ? "clear timer" : "set timer", req);
      }
      last_progress_ = now();
    }
    reap(now());
  }
}

void log_debug_info_for_expired_timers(
    const std::string& run_id,
    const std::map<pid_t, std::vector<TimerRequest>>& expired) {
  std::string text;
  for (const auto& [pid, timers] : expired) {
    text += (text.empty() ? "" : ", ") + std::to_string(pid) + ": [";
    for (size_t i = 0; i < timers.size(); ++i) {
      text += (i ? ", " : "") + std::string("\"") + timers[i].scope_id + "\"";
    }
    text += "]";
  }
  TIDE_LOG_INFO("[timer] Timers expired for run:[{}] [{{{}}}].", run_id, text);
}

}  // namespace tide::timer
