#include "agent/status_records.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/metrics/registry.h"

#include "agent/group_processes.h"
#include "agent/reporting.h"

namespace tide::agent::detail {

using status::AttemptStatus;
using status::NodeState;
using status::NodeStatus;
using status::RankStatus;
using status::Scores;

namespace {

// The attempts a record keeps (the oldest go first).
constexpr size_t kMaxAttempts = 32;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

StatusRecords::StatusRecords(
    const AgentView& view,
    const GroupProcesses& processes,
    const Reporter& reporter)
    : view_(view), processes_(processes), reporter_(reporter) {}

void StatusRecords::start() {
  const WorkerSpec& spec = view_.spec;
  if (spec.status_interval.count() > 0 && !publisher_) {
    auto handler = spec.rdzv_handler;
    publisher_ = std::make_unique<StatusPublisher>(
        [handler] { return handler->open_job_store(); });
    next_ = Clock::now() + spec.status_interval;
  }
  post(/*urgent=*/true);
}

NodeStatus StatusRecords::last_record() const {
  std::lock_guard lock(mutex_);
  return last_record_;
}

bool StatusRecords::ended(size_t i) const {
  return i < processes_.size() && processes_[i].exited();
}

void StatusRecords::entered(const Transition& t) {
  state_ = t.to;
  if (t.event == GroupEvent::kStarted) {
    // A new attempt. Its record goes once the workers have started, with
    // their pids (acted).
    if (attempts_.size() == kMaxAttempts) {
      attempts_.erase(attempts_.begin());
    }
    attempts_.push_back(AttemptStatus{
        .attempt = view_.restarts.used,
        .round = view_.rdzv.round,
        .start = now_seconds(),
        .outcome = attempt_outcome(t.event),
    });
    steps_.assign(view_.group.workers.size(), StepClock{});
    attempt_failures_.clear();
    return;
  }
  if (!attempts_.empty() && !attempts_.back().end) {
    attempts_.back().end = now_seconds();
    attempts_.back().outcome = attempt_outcome(t.event);
    attempts_.back().reason = t.reason;
  }
  for (const auto& [rank, f] : t.failures) {
    attempt_failures_.insert(f.local_rank);
  }
  if (t.action == Action::kRestart) {
    last_restart_ = {
        .at = now_seconds(),
        .reason = t.event == GroupEvent::kFailed ? "worker failure: " + t.reason
                                                 : t.reason};
  }
  post(/*urgent=*/true);
}

void StatusRecords::acted(const Transition& /*t*/) {
  // The workers started (with their pids) or stopped (STOPPING no more),
  // and the restarts counted.
  post(/*urgent=*/true);
}

void StatusRecords::beat(
    size_t local_rank, std::optional<int64_t> step, Clock::time_point at) {
  if (local_rank >= steps_.size()) {
    return;
  }
  StepClock& c = steps_[local_rank];
  c.beat = at;
  if (!step) {
    return;
  }
  if (c.mark && *step < c.mark->step) {
    c = StepClock{.beat = at};  // counting again from 0: a new measure
  }
  c.step = *step;
  c.at = at;
  if (!c.mark) {
    c.mark = StepClock::Mark{.step = *step, .at = at};
  }
}

void StatusRecords::due() {
  next_ = Clock::now() + view_.spec.status_interval;
  measure_steps();
  post(/*urgent=*/false);
}

void StatusRecords::post(bool urgent) {
  const WorkerSpec& spec = view_.spec;
  const WorkerGroup& group = view_.group;
  auto now = Clock::now();
  NodeStatus s{
      .node = view_.host,
      .health = spec.health_endpoint,
      .pid = ::getpid(),
      .role = spec.role,
      .state = to_string(state_),
      .round = view_.rdzv.round,
      .group_rank = group.group_rank,
      .group_world_size = group.group_world_size,
      .restarts = view_.restarts.used,
      .max_restarts = spec.max_restarts,
      .last_restart_at = last_restart_.at,
      .last_restart_reason = last_restart_.reason,
      .started_at = view_.started_at,
      .updated_at = now_seconds(),
      .interval = status::effective_status_interval(
          static_cast<double>(spec.status_interval.count()) / 1000,
          group.group_world_size),
      .attempts = attempts_,
  };
  for (size_t i = 0; i < group.workers.size() && i < processes_.size(); ++i) {
    const Worker& w = group.workers[i];
    const WorkerProcess& p = processes_[i];
    RankStatus r{
        .local_rank = w.local_rank,
        .rank = w.global_rank,
        .pid = p.pid(),
        .state = status::rank_state(
            state_,
            p.exited() ? std::optional<int>(p.exitcode()) : std::nullopt,
            attempt_failures_.contains(w.local_rank)),
    };
    if (i < steps_.size()) {
      const StepClock& c = steps_[i];
      if (c.beat) {
        r.beat_age = seconds_between(*c.beat, now);
      }
      r.step = c.step;
      r.step_time = c.step_time;
      r.best_step_time = c.best;
    }
    s.ranks.push_back(std::move(r));
  }
  {
    std::lock_guard lock(mutex_);
    last_record_ = s;
  }
  if (publisher_) {
    publisher_->post(std::move(s), urgent, group.group_rank == 0);
  }
}

void StatusRecords::measure_steps() {
  auto now = Clock::now();
  for (size_t i = 0; i < steps_.size(); ++i) {
    StepClock& c = steps_[i];
    if (!c.step || !c.mark || ended(i)) {
      continue;  // no pace to measure, or no more steps to come
    }
    if (*c.step > c.mark->step) {
      // The interval's pace, from its first beat to its last.
      double t = seconds_between(c.mark->at, c.at) /
                 static_cast<double>(*c.step - c.mark->step);
      c.step_time = t;
      c.best = c.best ? std::min(*c.best, t) : t;
      c.mark = StepClock::Mark{.step = *c.step, .at = c.at};
    } else if (c.step_time) {
      // No step this interval: the one in progress has taken at least
      // this long already.
      c.step_time = std::max(*c.step_time, seconds_between(c.mark->at, now));
    }
  }
  flag_stragglers();
}

void StatusRecords::flag_stragglers() {
  const WorkerSpec& spec = view_.spec;
  // The job's fastest rank, as the leader last found it among all records,
  // or one of this node's own if faster (or if the job keeps no records).
  std::optional<double> fastest =
      publisher_ ? publisher_->fastest_step_time() : std::nullopt;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto& t = steps_[i].step_time;
    if (t && *t > 0 && !ended(i) && (!fastest || *t < *fastest)) {
      fastest = t;
    }
  }
  for (size_t i = 0; i < steps_.size() && i < view_.group.workers.size(); ++i) {
    StepClock& c = steps_[i];
    const Worker& w = view_.group.workers[i];
    if (ended(i)) {
      continue;
    }
    Scores sc = status::score(
        RankStatus{.step_time = c.step_time, .best_step_time = c.best},
        fastest);
    bool below = sc.below(spec.straggler_threshold);
    auto labels = reporter_.labels({{"rank", std::to_string(w.global_rank)}});
    if (c.step_time) {
      metrics::gauge(
          "tide_worker_step_seconds",
          "A rank's time per training step over the last status interval "
          "(from the step numbers in its heartbeats).",
          labels)
          .set(*c.step_time);
    }
    metrics::gauge(
        "tide_worker_straggler",
        "1 while a rank is flagged as a straggler (a score below "
        "--straggler-threshold), else 0.",
        labels)
        .set(below ? 1 : 0);
    if (below == c.flagged) {
      continue;
    }
    c.flagged = below;
    metrics::put_metric(reporter_.metric("straggler"), below ? 1 : 0);
    if (below) {
      metrics::counter(
          "tide_agent_stragglers_total",
          "Ranks flagged as stragglers (each time one falls below the "
          "threshold).",
          reporter_.labels())
          .inc();
    }
    auto text = [](std::optional<double> v) {
      return v ? fmt::format("{:.2f}", *v) : std::string("-");
    };
    if (!below) {
      TIDE_LOG_INFO(
          "[{}] rank {} keeps pace again (scores: relative {}, own {})",
          spec.role,
          w.global_rank,
          text(sc.relative),
          text(sc.individual));
      continue;
    }
    TIDE_LOG_WARN(
        "[{}] rank {} (local {}) is a straggler: {:.3f} s a step against "
        "{} s for the job's fastest rank and {} s at its own best (scores: "
        "relative {}, own {}; threshold {})",
        spec.role,
        w.global_rank,
        w.local_rank,
        *c.step_time,
        fastest ? fmt::format("{:.3f}", *fastest) : "-",
        c.best ? fmt::format("{:.3f}", *c.best) : "-",
        text(sc.relative),
        text(sc.individual),
        spec.straggler_threshold);
    events::Event::Metadata meta{
        {"rank", int64_t{w.global_rank}},
        {"local_rank", int64_t{w.local_rank}},
        {"step",
         c.step ? events::MetadataValue{*c.step} : events::MetadataValue{}},
        {"step_time_ms", static_cast<int64_t>(*c.step_time * 1000)},
        {"threshold", spec.straggler_threshold},
    };
    if (sc.relative) {
      meta["relative_score"] = *sc.relative;
    }
    if (sc.individual) {
      meta["individual_score"] = *sc.individual;
    }
    reporter_.agent_event("straggler", std::move(meta));
  }
}

}  // namespace tide::agent::detail
