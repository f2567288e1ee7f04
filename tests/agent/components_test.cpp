// The agent's parts, each driven on its own, without a LocalElasticAgent:
// the transition table, the processes of a group, and the components
// (reporting, status records, hang detection, expiration timers), with real
// worker processes.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tide/rendezvous/registry.h"

#include "agent/group_processes.h"
#include "agent/hang_detector.h"
#include "agent/reporting.h"
#include "agent/status_records.h"
#include "agent/transition.h"
#include "agent/worker_timers.h"
#include "support/agent_fixture.h"
#include "support/eventually.h"

namespace tide::agent::detail {
namespace {

using namespace std::chrono_literals;
using status::NodeState;
namespace fs = std::filesystem;

ProcessFailure failure(int rank, int local_rank, std::string message) {
  return ProcessFailure{
      .local_rank = local_rank,
      .global_rank = rank,
      .exitcode = 1,
      .message = std::move(message)};
}

TEST(TransitionTest, TheTableSaysWhereEachEventLeadsAndWhatTheAgentDoes) {
  Restarts two{.used = 0, .left = 2};
  struct Row {
    Observation o;
    Restarts restarts;
    NodeState to;
    Action action;
    Restarts after;
    std::string reason;
  };
  std::vector<Row> rows = {
      {{.event = GroupEvent::kStarted},
       two,
       NodeState::kHealthy,
       Action::kWatch,
       two,
       ""},
      {{.event = GroupEvent::kSucceeded},
       two,
       NodeState::kSucceeded,
       Action::kFinish,
       two,
       ""},
      {{.event = GroupEvent::kFailed, .failures = {{3, failure(3, 1, "oops")}}},
       two,
       NodeState::kRestarting,
       Action::kRestart,
       {.used = 1, .left = 1},
       "rank 3 (local 1): oops"},
      {{.event = GroupEvent::kFailed, .failures = {{3, failure(3, 1, "oops")}}},
       {.used = 2, .left = 0},
       NodeState::kFailed,
       Action::kGiveUp,
       {.used = 2, .left = 0},
       "rank 3 (local 1): oops"},
      // A stop requested while a worker failed: the node stops, whatever
      // restarts are left, and uses none.
      {{.event = GroupEvent::kFailed,
        .failures = {{0, failure(0, 0, "killed")}},
        .stop_signal = SIGTERM},
       two,
       NodeState::kStopped,
       Action::kStop,
       two,
       "rank 0 (local 0): killed"},
      // Admitting nodes uses no restart.
      {{.event = GroupEvent::kMembershipChanged, .nodes_waiting = 2},
       two,
       NodeState::kRestarting,
       Action::kRestart,
       two,
       "membership changed: 2 node(s) waiting or lost"},
      {{.event = GroupEvent::kStopRequested, .stop_signal = SIGINT},
       two,
       NodeState::kStopped,
       Action::kStop,
       two,
       "stopped by SIGINT"},
      {{.event = GroupEvent::kRendezvousLost, .error = "closed"},
       two,
       NodeState::kFailed,
       Action::kStop,
       two,
       "rendezvous: closed"},
      {{.event = GroupEvent::kAborted, .error = "no such executable"},
       two,
       NodeState::kFailed,
       Action::kNothing,
       two,
       "no such executable"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(to_string(row.o.event));
    Transition t = decide(row.o, row.restarts);
    EXPECT_EQ(t.event, row.o.event);
    EXPECT_EQ(t.to, row.to);
    EXPECT_EQ(t.action, row.action);
    EXPECT_EQ(t.restarts.used, row.after.used);
    EXPECT_EQ(t.restarts.left, row.after.left);
    EXPECT_EQ(t.reason, row.reason);
    EXPECT_EQ(t.failures.size(), row.o.failures.size());
  }
  EXPECT_EQ(worker_state(NodeState::kRestarting), WorkerState::kStopped);
  EXPECT_STREQ(attempt_outcome(GroupEvent::kFailed), "FAILED");
  EXPECT_STREQ(attempt_outcome(GroupEvent::kMembershipChanged), "TERMINATED");
}

// One node's core, by hand: a view, the group's processes and the
// components under test, told of transitions as the agent would tell them.
class Parts : public test::AgentTest {
 protected:
  void SetUp() override {
    run_log_dir_ = (dir_ / "run").string();
    fs::create_directories(run_log_dir_);
  }

  // The parts for `s`, on a one-node round.
  void make(WorkerSpec s) {
    spec_ = std::make_unique<WorkerSpec>(std::move(s));
    restarts_ = {.used = 0, .left = spec_->max_restarts};
    view_ = std::make_unique<AgentView>(AgentView{
        .spec = *spec_,
        .host = host_,
        .run_log_dir = run_log_dir_,
        .group = group_,
        .rdzv = rdzv_,
        .restarts = restarts_,
        .started_at = started_at_,
    });
    processes_ = std::make_unique<GroupProcesses>(
        *view_,
        GroupProcesses::Options{
            .component_env =
                [this](std::map<std::string, std::string>& env) {
                  for (Component* c : components_) {
                    c->add_env(env);
                  }
                },
            .exited =
                [this](const std::set<pid_t>& pids) {
                  for (Component* c : components_) {
                    c->exited(pids);
                  }
                }});
    reporter_ = std::make_unique<Reporter>(*view_, *processes_);
  }

  // Starts a group of the spec's size, as the agent does on kStarted.
  void start_group() {
    rdzv_ = {.rank = 0, .world_size = 1, .round = 0};
    group_.group_rank = 0;
    group_.group_world_size = 1;
    group_.workers.clear();
    for (int i = 0; i < spec_->local_world_size; ++i) {
      group_.workers.push_back(Worker{
          .local_rank = i,
          .global_rank = i,
          .role_rank = i,
          .world_size = spec_->local_world_size,
          .role_world_size = spec_->local_world_size,
      });
    }
    processes_->open();
    processes_->choose_rpc_secret();
    processes_->prepare();
    announce(decide({.event = GroupEvent::kStarted}, restarts_));
  }

  // What the agent's act() does with t, less stopping on kRestart.
  void announce(const Transition& t) {
    for (Component* c : components_) {
      c->entered(t);
    }
    if (t.action == Action::kWatch) {
      processes_->start(group_);
    } else if (t.action != Action::kNothing) {
      processes_->stop(SIGTERM, 5s);
    }
    restarts_ = t.restarts;
    for (Component* c : components_) {
      c->acted(t);
    }
  }

  // The group's failures, explained by the components.
  std::map<int, ProcessFailure> failures() const {
    return processes_->failures([&](ProcessFailure& f) {
      for (Component* c : components_) {
        c->explain(f);
      }
    });
  }

  // Pumps, reaps, and hands the components what is due, until the group
  // is no longer running.
  bool until_the_group_ends() {
    return test::eventually([&] {
      for (Component* c : components_) {
        if (c->fd() >= 0) {
          c->readable();  // non-blocking: drains what arrived
        }
        if (Clock::now() >= c->deadline()) {
          c->due();
        }
      }
      processes_->on_wake();
      return processes_->state() != WorkerState::kHealthy;
    });
  }

  std::string host_ = "node-a";
  std::string run_log_dir_;
  WorkerGroup group_;
  rendezvous::RendezvousInfo rdzv_;
  Restarts restarts_;
  double started_at_ = now_seconds();
  std::unique_ptr<WorkerSpec> spec_;
  std::unique_ptr<AgentView> view_;
  std::unique_ptr<GroupProcesses> processes_;
  std::unique_ptr<Reporter> reporter_;
  std::vector<Component*> components_;
};

TEST_F(
    Parts, TheGroupsProcessesStartWithTorchrunsEnvironmentAndReportFailures) {
  make(spec(sh("test \"$RANK/$WORLD_SIZE\" = 1/2 && exit 3; exit 0"), 2));
  start_group();
  ASSERT_EQ(processes_->size(), 2u);
  EXPECT_GT(group_.workers[0].pid, 0);
  EXPECT_EQ(group_.workers[1].pid, (*processes_)[1].pid());
  ASSERT_TRUE(test::eventually([&] {
    processes_->on_wake();
    return (*processes_)[0].exited() && (*processes_)[1].exited();
  }));
  EXPECT_EQ(processes_->state(), WorkerState::kFailed);
  auto f = failures();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f.at(1).local_rank, 1);
  EXPECT_EQ(f.at(1).exitcode, 3);
  EXPECT_EQ(f.at(1).host, "node-a");
  EXPECT_NE(f.at(1).message.find("exited with code 3"), std::string::npos);
  EXPECT_EQ(processes_->attempt_log_dir(), run_log_dir_ + "/attempt_0");
}

TEST_F(Parts, StatusRecordsShowEachTransitionOnlyOnceItIsDecided) {
  make(spec(sh("test \"$LOCAL_RANK\" = 1 && exit 3; exec sleep 30"), 2));
  StatusRecords records(*view_, *processes_, *reporter_);
  components_ = {reporter_.get(), &records};
  records.start();
  EXPECT_EQ(records.last_record().state, "STARTING");

  start_group();
  status::NodeStatus healthy = records.last_record();
  EXPECT_EQ(healthy.state, "HEALTHY");
  ASSERT_EQ(healthy.ranks.size(), 2u);
  EXPECT_EQ(healthy.ranks[0].pid, group_.workers[0].pid);
  ASSERT_EQ(healthy.attempts.size(), 1u);
  EXPECT_EQ(healthy.attempts[0].outcome, "RUNNING");

  // Rank 1 exits; nothing is posted until the agent decides what that
  // means (the failure, then a restart).
  ASSERT_TRUE(until_the_group_ends());
  EXPECT_EQ(records.last_record().state, "HEALTHY");
  EXPECT_EQ(records.last_record().ranks[1].state, "HEALTHY");
  Transition t = decide(
      {.event = GroupEvent::kFailed, .failures = failures()},
      {.used = 0, .left = 1});
  for (Component* c : components_) {
    c->entered(t);
  }
  status::NodeStatus restarting = records.last_record();
  EXPECT_EQ(restarting.state, "RESTARTING");
  EXPECT_EQ(restarting.ranks[1].state, "FAILED");
  EXPECT_EQ(restarting.ranks[0].state, "STOPPING");  // not stopped yet
  EXPECT_EQ(restarting.attempts[0].outcome, "FAILED");
  EXPECT_EQ(
      restarting.last_restart_reason,
      "worker failure: rank 1 (local 1): " + t.failures.at(1).message);
  processes_->stop(SIGTERM, 5s);
  restarts_ = t.restarts;
  for (Component* c : components_) {
    c->acted(t);
  }
  status::NodeStatus stopped = records.last_record();
  EXPECT_EQ(stopped.ranks[0].state, "STOPPED");
  EXPECT_EQ(stopped.restarts, 1);
  // The reporter's snapshot follows the same transitions.
  EXPECT_EQ(reporter_->snapshot().state, WorkerState::kStopped);
}

TEST_F(Parts, StatusRecordsMeasureStepTimesFromHeartbeats) {
  auto s = spec(sh("exec sleep 30"), 2);
  s.status_interval = 10min;  // due only when the test says
  make(std::move(s));
  StatusRecords records(*view_, *processes_, *reporter_);
  components_ = {&records};
  start_group();
  auto t0 = Clock::now();
  records.beat(0, 100, t0);
  records.beat(0, 110, t0 + 2s);      // 0.2 s a step
  records.beat(1, std::nullopt, t0);  // a beat with no step number
  records.due();
  status::NodeStatus r = records.last_record();
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[0].step, 110);
  ASSERT_TRUE(r.ranks[0].step_time);
  EXPECT_DOUBLE_EQ(*r.ranks[0].step_time, 0.2);
  EXPECT_DOUBLE_EQ(*r.ranks[0].best_step_time, 0.2);
  EXPECT_FALSE(r.ranks[1].step);
  EXPECT_TRUE(r.ranks[1].beat_age);
  // Counting from 0 again (a restarted loop) is a new measure, not a
  // negative pace.
  records.beat(0, 0, t0 + 3s);
  records.due();
  EXPECT_EQ(records.last_record().ranks[0].step, 0);
  EXPECT_FALSE(records.last_record().ranks[0].step_time);
  processes_->stop(SIGTERM, 5s);
}

TEST_F(Parts, TheHangDetectorKillsAWorkerWhoseHeartbeatsStopAndSaysWhy) {
  auto s = spec(FunctionCall{"heartbeat_then_hang", {}}, 1);
  s.start_method = StartMethod::kSpawn;
  s.heartbeat_timeout = 300ms;
  make(std::move(s));
  std::vector<std::optional<int64_t>> beats;
  HangDetector hangs(
      *view_,
      *processes_,
      *reporter_,
      [&](size_t rank, std::optional<int64_t> step, Clock::time_point) {
        EXPECT_EQ(rank, 0u);
        beats.push_back(step);
      });
  components_ = {&hangs};
  hangs.start();
  ASSERT_GE(hangs.fd(), 0);
  EXPECT_EQ(hangs.deadline(), Clock::time_point::max());  // none watched yet
  start_group();
  ASSERT_TRUE(until_the_group_ends());
  EXPECT_FALSE(beats.empty());
  auto f = failures();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f.at(0).exitcode, -SIGKILL);
  EXPECT_NE(f.at(0).message.find("hung: rank 0"), std::string::npos)
      << f.at(0).message;
  EXPECT_NE(f.at(0).traceback.find(" -p "), std::string::npos);
  // Judged once: a killed worker is no longer watched.
  EXPECT_EQ(hangs.deadline(), Clock::time_point::max());
}

TEST_F(Parts, ExpirationTimersKillAWorkerPastItsDeadlineAndExplainTheFailure) {
  make(spec(
      sh(std::string("exec ") + TIDE_TIMER_CHILD +
         " local \"$TIDE_TIMER_SOCKET\" step_scope 0.2 9"),
      1));
  spec_->timer = WorkerSpec::Timer::kLocal;
  WorkerTimers timers(*view_, *processes_, *reporter_);
  components_ = {&timers};
  timers.start();
  std::map<std::string, std::string> env;
  timers.add_env(env);
  EXPECT_EQ(env.at("TIDE_TIMER_SOCKET"), run_log_dir_ + "/timer.sock");
  start_group();
  ASSERT_TRUE(until_the_group_ends());
  auto f = failures();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f.at(0).exitcode, -SIGKILL);
  EXPECT_NE(
      f.at(0).message.find("expiration timer \"step_scope\" expired"),
      std::string::npos)
      << f.at(0).message;
  EXPECT_GT(timers.last_progress(), started_at_);
}

TEST_F(Parts, TheReportersSnapshotFollowsTheTransitions) {
  make(spec(sh("exit 0"), 1));
  components_ = {reporter_.get()};
  start_group();
  ASSERT_TRUE(until_the_group_ends());
  announce(decide(
      {.event = GroupEvent::kMembershipChanged, .nodes_waiting = 1},
      restarts_));
  AgentStatus s = reporter_->snapshot();
  EXPECT_EQ(s.state, WorkerState::kStopped);
  EXPECT_EQ(s.restart_count, 0);  // a membership change is not a restart
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_GT(s.workers[0].pid, 0);
}

}  // namespace
}  // namespace tide::agent::detail
