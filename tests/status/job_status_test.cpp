// The job's status board in one process: records to JSON and back, bad
// records, the straggler scores, the board in a store, and what a reader
// makes of the records (tide/status/job_status.h).
#include "tide/status/job_status.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/store/hash_store.h"

#include "common/clock.h"
#include "tiderun/status_table.h"

namespace tide::status {
namespace {

NodeStatus record(
    const std::string& node,
    double updated_at,
    std::vector<std::optional<double>> step_times = {}) {
  NodeStatus s{
      .node = node,
      .pid = 100,
      .role = "default",
      .state = "HEALTHY",
      .round = 2,
      .group_rank = 0,
      .group_world_size = 2,
      .updated_at = updated_at,
      .interval = 1,
  };
  int rank = 0;
  for (auto t : step_times) {
    s.ranks.push_back(RankStatus{
        .local_rank = rank,
        .rank = rank,
        .pid = 200 + rank,
        .state = "HEALTHY",
        .beat_age = 0.1,
        .step = t ? std::optional<int64_t>(10) : std::nullopt,
        .step_time = t,
        .best_step_time = t,
    });
    ++rank;
  }
  return s;
}

TEST(JobStatusTest, ARecordSurvivesItsJsonAndItsAttemptsTheirs) {
  NodeStatus s = record("host-a", 1000.5, {0.05, std::nullopt});
  s.health = "host-a:8080";
  s.restarts = 1;
  s.max_restarts = 3;
  s.last_restart_at = 990;
  s.last_restart_reason = "worker failure: rank 1 (local 1): exited 1";
  NodeStatus back = node_status_from_json(to_json(s));
  EXPECT_EQ(back.node, "host-a");
  EXPECT_EQ(back.health, "host-a:8080");
  EXPECT_EQ(back.restarts, 1);
  EXPECT_EQ(back.last_restart_reason, s.last_restart_reason);
  ASSERT_EQ(back.ranks.size(), 2u);
  EXPECT_EQ(back.ranks[0].step_time, 0.05);
  EXPECT_EQ(back.ranks[1].step, std::nullopt);
  EXPECT_EQ(back.ranks[1].step_time, std::nullopt);

  std::vector<AttemptStatus> attempts{
      {.attempt = 0,
       .round = 1,
       .start = 1,
       .end = 2,
       .outcome = "FAILED",
       .reason = "x"},
      {.attempt = 1, .round = 1, .start = 3, .outcome = "RUNNING"}};
  auto again = attempts_from_json(attempts_to_json(attempts));
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].end, 2);
  EXPECT_EQ(again[1].end, std::nullopt);
  EXPECT_EQ(again[1].outcome, "RUNNING");
}

TEST(JobStatusTest, ABadRecordIsAProtocolErrorNamingWhatIsWrong) {
  EXPECT_THROW(node_status_from_json("not json"), ProtocolError);
  EXPECT_THROW(node_status_from_json("[1, 2]"), ProtocolError);
  EXPECT_THROW(node_status_from_json(R"({"node": "a"})"), ProtocolError);
  try {
    node_status_from_json(R"({"node": "a", "updated_at": 1, "restarts": "x"})");
    FAIL() << "no error";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("\"restarts\""), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      node_status_from_json(R"({"node": "a", "updated_at": 1, "ranks": [1]})"),
      ProtocolError);
  EXPECT_THROW(attempts_from_json(R"({"a": 1})"), ProtocolError);
}

TEST(JobStatusTest, ScoresCompareARankWithTheFastestAndWithItsOwnBest) {
  RankStatus r{.step_time = 0.2, .best_step_time = 0.1};
  Scores s = score(r, 0.05);
  EXPECT_DOUBLE_EQ(*s.relative, 0.25);
  EXPECT_DOUBLE_EQ(*s.individual, 0.5);
  EXPECT_TRUE(s.below(0.7));
  EXPECT_FALSE(s.below(0.2));
  // Without a job-wide figure there is no relative score; without steps,
  // none at all.
  EXPECT_EQ(score(r, std::nullopt).relative, std::nullopt);
  Scores none = score(RankStatus{}, 0.05);
  EXPECT_EQ(none.relative, std::nullopt);
  EXPECT_EQ(none.individual, std::nullopt);
  EXPECT_FALSE(none.below(0.7));
}

TEST(JobStatusTest, TheViewFlagsTheSlowRankAndCallsASilentNodeDegraded) {
  double now = 10'000;
  std::vector<NodeStatus> records{
      record("a", now - 0.5, {0.05, 0.06}),
      record("b", now - 0.5, {0.05, 0.5}),
  };
  JobView v = make_job_view("job", records, now, 0.7);
  EXPECT_EQ(v.state, "DEGRADED");  // a straggler
  EXPECT_EQ(v.ranks, 4);
  ASSERT_EQ(v.nodes.size(), 2u);
  EXPECT_FALSE(v.nodes[0].ranks[0].straggler);
  EXPECT_FALSE(v.nodes[0].ranks[1].straggler);
  EXPECT_FALSE(v.nodes[1].ranks[0].straggler);
  EXPECT_TRUE(v.nodes[1].ranks[1].straggler);
  EXPECT_DOUBLE_EQ(*v.nodes[1].ranks[1].scores.relative, 0.1);

  records[1].ranks[1].step_time = 0.05;
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "HEALTHY");
  // Silent for more than three intervals (and a second): degraded.
  records[1].updated_at = now - 4.5;
  v = make_job_view("job", records, now, 0.7);
  EXPECT_EQ(v.state, "DEGRADED");
  EXPECT_TRUE(v.nodes[1].silent);
  // Past its expiry it is gone from the view.
  records[1].updated_at = now - 61;
  v = make_job_view("job", records, now, 0.7);
  EXPECT_EQ(v.nodes.size(), 1u);
  EXPECT_EQ(v.state, "HEALTHY");

  records[0].state = "FAILED";
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "FAILED");
  EXPECT_EQ(make_job_view("job", {}, now, 0.7).state, "UNKNOWN");
  records[0].state = "SUCCEEDED";
  records.pop_back();
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "SUCCEEDED");
}

TEST(JobStatusTest, ARanksStateNeverContradictsItsNodes) {
  // A running process is HEALTHY only in a HEALTHY group.
  EXPECT_STREQ(rank_state(NodeState::kHealthy, std::nullopt, false), "HEALTHY");
  for (NodeState n :
       {NodeState::kRestarting, NodeState::kFailed, NodeState::kStopped}) {
    EXPECT_STREQ(rank_state(n, std::nullopt, false), "STOPPING");
    // The exit that ended the attempt is its failure; the others the
    // agent's stop.
    EXPECT_STREQ(rank_state(n, 1, /*failed=*/true), "FAILED");
    EXPECT_STREQ(rank_state(n, -15, /*failed=*/false), "STOPPED");
    EXPECT_STREQ(rank_state(n, 0, false), "SUCCEEDED");
  }
  EXPECT_STREQ(to_string(NodeState::kRestarting), "RESTARTING");
  EXPECT_TRUE(is_final(NodeState::kStopped));
  EXPECT_FALSE(is_final(NodeState::kRestarting));
}

TEST(JobStatusTest, TheJobsStateComesFromItsCurrentRoundsMembersOnly) {
  double now = 10'000;
  auto node = [&](const char* name, int64_t round, const char* state) {
    NodeStatus s = record(name, now - 0.5, {0.05});
    s.round = round;
    s.state = state;
    s.restarts = 1;
    return s;
  };
  // A node restarting its group: not HEALTHY, and not FAILED either.
  std::vector<NodeStatus> records{
      node("a", 2, "HEALTHY"), node("b", 2, "RESTARTING")};
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "RESTARTING");
  records[1].state = "STARTING";
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "STARTING");
  // A member stopped while another runs: degraded; every member done,
  // one stopped: stopped.
  records[1].state = "STOPPED";
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "DEGRADED");
  records[0].state = "SUCCEEDED";
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "STOPPED");

  // Node c of round 2 was lost (silent, failed): a and b went on in round
  // 3 without it, and d waits to join (STARTING, no round yet). Only a and
  // b count, and the job is healthy.
  records = {
      node("a", 3, "HEALTHY"),
      node("b", 3, "HEALTHY"),
      node("c", 2, "FAILED"),
      node("d", 0, "STARTING")};
  records[2].updated_at = now - 30;
  JobView v = make_job_view("job", records, now, 0.7);
  EXPECT_EQ(v.state, "HEALTHY");
  EXPECT_EQ(v.round, 3);
  EXPECT_EQ(v.ranks, 2);
  EXPECT_EQ(v.restarts, 2);
  ASSERT_EQ(v.nodes.size(), 4u);
  EXPECT_TRUE(v.nodes[0].member);
  EXPECT_TRUE(v.nodes[1].member);
  EXPECT_FALSE(v.nodes[2].member);
  EXPECT_TRUE(v.nodes[2].silent);
  EXPECT_FALSE(v.nodes[3].member);
  auto j = nlohmann::json::parse(to_json(v));
  EXPECT_EQ(j["nodes"][2]["member"], false);
  std::string text = tiderun::format_job_view(v);
  EXPECT_NE(
      text.find("job job: HEALTHY, round 3, 2 node(s), 2 rank(s)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("2 other node(s) not in the round"), std::string::npos)
      << text;
  EXPECT_NE(
      text.find("FAILED (SILENT) (not in the current round)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("STARTING (waiting to join)"), std::string::npos) << text;
  // A silent member is another matter: the job is degraded.
  records[1].updated_at = now - 30;
  EXPECT_EQ(make_job_view("job", records, now, 0.7).state, "DEGRADED");
}

TEST(JobStatusTest, TheBoardKeepsOneSlotAnAgentAndSkipsWhatItCannotRead) {
  auto store = store::make_hash_store();
  StatusBoard board(*store);
  NodeStatus a = record("a", 1, {0.05});
  a.slot = board.claim_slot();
  a.attempts = {{.attempt = 0, .start = 1, .outcome = "RUNNING"}};
  board.publish(a, /*with_attempts=*/true);
  // Ten seconds old: silent (three intervals and a second), not expired.
  NodeStatus b = record("b", now_seconds() - 10, {0.08});
  b.slot = board.claim_slot();
  EXPECT_EQ(b.slot, a.slot + 1);
  board.publish(b, /*with_attempts=*/true);
  // A slot claimed but not written yet, and a record that is not one.
  int64_t pending = board.claim_slot();
  int64_t garbage = board.claim_slot();
  store->set("node/" + std::to_string(garbage), "{not json");
  store->set("attempts/" + std::to_string(garbage), "[]");

  std::vector<std::string> unreadable;
  auto read = board.read(&unreadable);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].node, "a");
  ASSERT_EQ(read[0].attempts.size(), 1u);
  EXPECT_EQ(read[1].node, "b");
  EXPECT_EQ(read[1].slot, b.slot);
  ASSERT_EQ(unreadable.size(), 1u);
  EXPECT_NE(
      unreadable[0].find("slot " + std::to_string(garbage)), std::string::npos);
  (void)pending;

  board.retire(a.slot);
  read = board.read();
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].node, "b");

  EXPECT_EQ(board.fastest_step_time(), std::nullopt);
  board.set_fastest_step_time(0.05);
  EXPECT_EQ(board.fastest_step_time(), 0.05);
  store->set("job", "garbage");
  EXPECT_EQ(board.fastest_step_time(), std::nullopt);

  // The view of the board as the JSON the page and tiderun status read.
  auto j = nlohmann::json::parse(to_json(read_job_view(*store, "job", 0.7)));
  EXPECT_EQ(j["run_id"], "job");
  ASSERT_EQ(j["nodes"].size(), 1u);
  EXPECT_EQ(j["nodes"][0]["node"], "b");
  EXPECT_EQ(j["nodes"][0]["stale"], true);
  EXPECT_EQ(j["unreadable"].size(), 1u);
}

}  // namespace
}  // namespace tide::status
