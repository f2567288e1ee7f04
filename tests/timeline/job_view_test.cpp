// The timeline of a job view (src/timeline/job_view.h): what the live page's
// GET /api/timeline.svg and `tide-timeline job.json` draw.
#include "timeline/job_view.h"

#include <string>

#include <gtest/gtest.h>

#include "timeline/events.h"
#include "timeline/render.h"
#include "timeline/trace.h"

namespace tide::timeline {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// Two nodes, 60 s in: host-b's rank failed at 30 s and both groups
// restarted; host-b's second attempt runs.
json two_nodes() {
  const double now = 1'800'000'000;
  auto node = [&](const char* name, int slot, json attempts, json last) {
    return json{
        {"node", name},
        {"slot", slot},
        {"group_rank", slot},
        {"started_at", now - 60},
        {"stale", false},
        {"age", 0.5},
        {"ranks",
         json::array({{{"rank", 2 * slot}}, {{"rank", 2 * slot + 1}}})},
        {"attempts", attempts},
        {"last_restart", last}};
  };
  json a_attempts = json::array(
      {{{"attempt", 0},
        {"round", 1},
        {"start", now - 59},
        {"end", now - 30},
        {"outcome", "TERMINATED"},
        {"reason", "membership change"}},
       {{"attempt", 1},
        {"round", 2},
        {"start", now - 28},
        {"end", nullptr},
        {"outcome", "RUNNING"}}});
  json b_attempts = json::array(
      {{{"attempt", 0},
        {"round", 1},
        {"start", now - 59},
        {"end", now - 30},
        {"outcome", "FAILED"},
        {"reason", "rank 3 (local 1) exited with code 1"}},
       {{"attempt", 1},
        {"round", 2},
        {"start", now - 28},
        {"end", nullptr},
        {"outcome", "RUNNING"}}});
  return json{
      {"run_id", "job-1"},
      {"now", now},
      {"state", "HEALTHY"},
      {"nodes",
       json::array(
           {node("host-a", 0, a_attempts, nullptr),
            node(
                "host-b",
                1,
                b_attempts,
                {{"at", now - 30},
                 {"reason", "worker failure: rank 3 exited with code 1"}})})}};
}

TEST(JobViewTimelineTest, DrawsEachNodesRecordedAttemptsAndRestarts) {
  json view = two_nodes();
  ASSERT_TRUE(as_job_view(view.dump()).has_value());
  Timeline tl = timeline_of_job(view);
  EXPECT_TRUE(tl.live);
  EXPECT_EQ(tl.run_id, "job-1");
  EXPECT_EQ(tl.t1, 1'800'000'000'000);
  EXPECT_EQ(tl.t0, tl.t1 - 60'000);
  EXPECT_EQ(tl.attempts, 2);
  ASSERT_EQ(tl.records.size(), 2u);
  const NodeRecord& b = tl.records.at("host-b");
  EXPECT_EQ(b.group_rank, 1);
  EXPECT_EQ(b.ranks, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(b.attempts.size(), 2u);
  EXPECT_EQ(b.attempts[0].outcome, Outcome::kFailed);
  EXPECT_EQ(b.attempts[1].outcome, Outcome::kRunning);
  EXPECT_EQ(b.attempts[1].end_ms, tl.t1);  // runs until now
  // One restart each, named by what ended the attempt before it, or by the
  // node's last restart when it is that one.
  ASSERT_EQ(tl.agent_notes.at("host-a").size(), 1u);
  EXPECT_EQ(
      tl.agent_notes.at("host-a")[0].label, "TERMINATED: membership change");
  ASSERT_EQ(tl.agent_notes.at("host-b").size(), 1u);
  EXPECT_EQ(
      tl.agent_notes.at("host-b")[0].label,
      "worker failure: rank 3 exited with code 1");

  std::string svg = render_svg(tl, "Timeline of run job-1");
  EXPECT_EQ(count(svg, "<g class=\"node\" data-host="), 2u) << svg;
  EXPECT_EQ(count(svg, "<g class=\"attempts-lane\""), 2u) << svg;
  EXPECT_EQ(count(svg, "data-outcome=\"RUNNING\""), 2u) << svg;
  EXPECT_EQ(count(svg, "data-attempt=\"0\" data-outcome=\"FAILED\""), 1u);
  EXPECT_EQ(count(svg, "data-attempt=\"0\" data-outcome=\"TERMINATED\""), 1u);
  EXPECT_EQ(count(svg, "class=\"marker restart\""), 2u);
  EXPECT_NE(svg.find("rank 3 (local 1) exited with code 1"), std::string::npos)
      << "the failed attempt's reason is in its tooltip";
  EXPECT_NE(svg.find("job HEALTHY"), std::string::npos);
  // Workers' lanes are what a view does not hold.
  EXPECT_EQ(count(svg, "<g class=\"lane\""), 0u);

  json trace = json::parse(render_trace(tl, "t"));
  size_t attempts = 0;
  for (const json& e : trace["traceEvents"]) {
    attempts += e.value("cat", "") == "attempt" && e["ph"] == "X" ? 1 : 0;
  }
  EXPECT_EQ(attempts, 4u);
}

TEST(JobViewTimelineTest, AgentsOfOneHostAreToldApartBySlot) {
  json view = two_nodes();
  view["nodes"][1]["node"] = "host-a";
  Timeline tl = timeline_of_job(view);
  ASSERT_EQ(tl.records.size(), 2u);
  EXPECT_TRUE(tl.records.count("host-a #0"));
  EXPECT_TRUE(tl.records.count("host-a #1"));
}

TEST(JobViewTimelineTest, AJustStartedJobIsDrawnTenSecondsWide) {
  json view = two_nodes();
  for (json& n : view["nodes"]) {
    n["started_at"] = view["now"].get<double>() - 1;
    n["attempts"] = json::array();
  }
  Timeline tl = timeline_of_job(view);
  EXPECT_EQ(tl.t1 - tl.t0, 10'000);
}

TEST(JobViewTimelineTest, BadViewsAreRefusedAndBadFieldsReadAsAbsent) {
  EXPECT_FALSE(as_job_view("{\"name\": \"torchelastic.agent.restart\"}"));
  EXPECT_FALSE(as_job_view("not json"));
  EXPECT_FALSE(as_job_view("[1, 2]"));
  try {
    timeline_of_job(json::array());
    FAIL() << "an array is not a job view";
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find("not a job view"), std::string::npos);
  }
  EXPECT_THROW(timeline_of_job(json{{"nodes", json::array()}}), Fatal);
  EXPECT_THROW(
      timeline_of_job(json{{"now", "soon"}, {"nodes", json::array()}}), Fatal);

  // A shared store's values: whatever is not what it should be is absent,
  // and the rest is drawn.
  json view = two_nodes();
  view["nodes"].push_back("not a node");
  view["nodes"][0]["attempts"][0]["start"] = "yesterday";
  view["nodes"][0]["attempts"][1]["outcome"] = "<script>";
  view["nodes"][0]["ranks"] = 7;
  view["nodes"][1]["node"] = "<b>&\"";
  Timeline tl = timeline_of_job(view);
  ASSERT_EQ(tl.records.size(), 2u);
  const NodeRecord& a = tl.records.at("host-a");
  ASSERT_EQ(a.attempts.size(), 1u);
  EXPECT_EQ(a.attempts[0].outcome, Outcome::kRunning);  // no end: it runs
  EXPECT_TRUE(a.ranks.empty());
  std::string svg = render_svg(tl, "t");
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;b&gt;&amp;&quot;"), std::string::npos);
}

}  // namespace
}  // namespace tide::timeline
