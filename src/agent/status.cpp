// The agent's part of the job's status board (tide/status/job_status.h): the
// record of its node it posts to its publisher, the attempts of its group,
// the ranks' step times from their heartbeats, and the straggler flags.
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/metrics/registry.h"

#include "agent/agent_impl.h"

namespace tide::agent {

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

void LocalElasticAgent::Impl::start_status() {
  const WorkerSpec& spec = self.spec_;
  if (spec.status_interval.count() <= 0 || status_publisher) {
    return;
  }
  auto handler = spec.rdzv_handler;
  status_publisher = std::make_unique<detail::StatusPublisher>(
      [handler] { return handler->open_job_store(); });
  next_status = Clock::now() + spec.status_interval;
}

NodeStatus LocalElasticAgent::node_status() const {
  std::lock_guard lock(impl_->status_mutex);
  return impl_->last_record;
}

std::string LocalElasticAgent::worker_log_dir(int local_rank) const {
  std::lock_guard lock(impl_->status_mutex);
  if (impl_->attempt_log_dir.empty() || local_rank < 0 ||
      local_rank >= spec_.local_world_size) {
    return "";
  }
  return impl_->attempt_log_dir + "/" + std::to_string(local_rank);
}

void LocalElasticAgent::Impl::post_status(bool urgent) {
  const WorkerSpec& spec = self.spec_;
  if (node_state == NodeState::kHealthy &&
      processes.size() < group.workers.size()) {
    return;  // a running group's record has its workers' pids: posted
             // by start_workers once they have started
  }
  auto now = Clock::now();
  NodeStatus s{
      .node = host,
      .health = spec.health_endpoint,
      .pid = ::getpid(),
      .role = spec.role,
      .state = to_string(node_state),
      .round = rdzv.round,
      .group_rank = group.group_rank,
      .group_world_size = group.group_world_size,
      .restarts = restarts.used,
      .max_restarts = spec.max_restarts,
      .last_restart_at = last_restart.at,
      .last_restart_reason = last_restart.reason,
      .started_at = started_at,
      .updated_at = now_seconds(),
      .interval = status::effective_status_interval(
          static_cast<double>(spec.status_interval.count()) / 1000,
          group.group_world_size),
      .attempts = attempts,
  };
  for (size_t i = 0; i < group.workers.size() && i < processes.size(); ++i) {
    const Worker& w = group.workers[i];
    const auto& p = *processes[i];
    RankStatus r{
        .local_rank = w.local_rank,
        .rank = w.global_rank,
        .pid = p.pid(),
        .state = status::rank_state(
            node_state,
            p.exited() ? std::optional<int>(p.exitcode()) : std::nullopt,
            attempt_failures.contains(w.local_rank)),
    };
    if (i < last_beat.size() && last_beat[i]) {
      r.beat_age = seconds_between(*last_beat[i], now);
    }
    if (i < steps.size()) {
      r.step = steps[i].step;
      r.step_time = steps[i].step_time;
      r.best_step_time = steps[i].best;
    }
    s.ranks.push_back(std::move(r));
  }
  {
    std::lock_guard lock(status_mutex);
    last_record = s;
  }
  if (status_publisher) {
    status_publisher->post(std::move(s), urgent, group.group_rank == 0);
  }
}

void LocalElasticAgent::Impl::begin_attempt() {
  if (attempts.size() == kMaxAttempts) {
    attempts.erase(attempts.begin());
  }
  attempts.push_back(AttemptStatus{
      .attempt = restarts.used,
      .round = rdzv.round,
      .start = now_seconds(),
      .outcome = "RUNNING",
  });
  steps.assign(group.workers.size(), StepClock{});
  attempt_failures.clear();
}

void LocalElasticAgent::Impl::end_attempt(
    const std::string& outcome, const std::string& reason) {
  if (attempts.empty() || attempts.back().end) {
    return;
  }
  attempts.back().end = now_seconds();
  attempts.back().outcome = outcome;
  attempts.back().reason = reason;
}

void LocalElasticAgent::Impl::note_restart(const std::string& reason) {
  last_restart = {.at = now_seconds(), .reason = reason};
}

void LocalElasticAgent::Impl::note_step(
    size_t local_rank, int64_t step, Clock::time_point at) {
  if (local_rank >= steps.size()) {
    return;
  }
  StepClock& c = steps[local_rank];
  if (c.mark && step < c.mark->step) {
    c = StepClock{};  // counting again from 0: a new measure
  }
  c.step = step;
  c.at = at;
  if (!c.mark) {
    c.mark = StepClock::Mark{.step = step, .at = at};
  }
}

void LocalElasticAgent::Impl::measure_steps() {
  auto now = Clock::now();
  for (size_t i = 0; i < steps.size(); ++i) {
    StepClock& c = steps[i];
    if (!c.step || !c.mark ||
        (i < processes.size() && processes[i]->exited())) {
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

void LocalElasticAgent::Impl::flag_stragglers() {
  const WorkerSpec& spec = self.spec_;
  // The job's fastest rank, as the leader last found it among all records,
  // or one of this node's own if faster (or if the job keeps no records).
  std::optional<double> fastest =
      status_publisher ? status_publisher->fastest_step_time() : std::nullopt;
  for (size_t i = 0; i < steps.size() && i < processes.size(); ++i) {
    const auto& t = steps[i].step_time;
    if (t && *t > 0 && !processes[i]->exited() && (!fastest || *t < *fastest)) {
      fastest = t;
    }
  }
  for (size_t i = 0; i < steps.size() && i < group.workers.size(); ++i) {
    StepClock& c = steps[i];
    const Worker& w = group.workers[i];
    if (i < processes.size() && processes[i]->exited()) {
      continue;
    }
    Scores sc = status::score(
        RankStatus{.step_time = c.step_time, .best_step_time = c.best},
        fastest);
    bool below = sc.below(spec.straggler_threshold);
    auto labels = metric_labels({{"rank", std::to_string(w.global_rank)}});
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
    metrics::put_metric(metric("straggler"), below ? 1 : 0);
    if (below) {
      metrics::counter(
          "tide_agent_stragglers_total",
          "Ranks flagged as stragglers (each time one falls below the "
          "threshold).",
          metric_labels())
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
    agent_event("straggler", std::move(meta));
  }
}

}  // namespace tide::agent
