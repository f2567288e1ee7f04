// tide-timeline as a user runs it: on a real tiderun events file, on files
// with junk in them, and on files it cannot use.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using test::Subprocess;
namespace fs = std::filesystem;

class TimelineTest : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& content) {
    fs::path p = dir_ / name;
    std::ofstream(p) << content;
    return p;
  }

  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // Runs argv to the end; returns (exit code, stdout and stderr).
  static std::pair<int, std::string> run(
      const std::vector<std::string>& argv,
      std::chrono::seconds timeout = 30s) {
    Subprocess p(argv, {.merge_stderr = true});
    std::string out = p.read_all(timeout);
    auto status = p.wait(timeout);
    EXPECT_TRUE(status.has_value()) << argv[0] << " did not exit\n" << out;
    int code = status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
    return {code, out};
  }

  static std::pair<int, std::string> timeline(std::vector<std::string> args) {
    args.insert(args.begin(), TIDE_TIMELINE_BIN);
    return run(args);
  }

  static size_t count(const std::string& haystack, const std::string& needle) {
    size_t n = 0;
    for (size_t at = haystack.find(needle); at != std::string::npos;
         at = haystack.find(needle, at + needle.size())) {
      ++n;
    }
    return n;
  }

  // Well-formed enough: one root svg element, every group closed.
  static void expect_svg_document(const std::string& svg) {
    EXPECT_TRUE(svg.rfind("<?xml", 0) == 0 || svg.rfind("<svg", 0) == 0)
        << svg.substr(0, 200);
    std::string trimmed = svg.substr(0, svg.find_last_not_of(" \n") + 1);
    EXPECT_TRUE(trimmed.ends_with("</svg>")) << trimmed.substr(
        trimmed.size() - std::min<size_t>(trimmed.size(), 200));
    EXPECT_EQ(count(svg, "<svg"), 1u);
    EXPECT_EQ(count(svg, "<g ") + count(svg, "<g>"), count(svg, "</g>"));
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

// One worker's HEALTHY or end event, in tiderun's layout.
std::string worker_event(
    const std::string& state,
    int64_t t_ms,
    int rank,
    const std::string& pid,
    const std::string& raw_error = "null",
    const std::string& run_id = "r1") {
  return R"({"name":"torchelastic.worker.status.)" + state +
         R"(","source":"AGENT","timestamp":)" + std::to_string(t_ms) +
         R"(,"metadata":{"run_id":")" + run_id + R"(","global_rank":)" +
         std::to_string(rank) + R"(,"group_rank":0,"worker_id":")" + pid +
         R"(","role":"default","hostname":"h1","state":")" + state +
         R"(","raw_error":)" + raw_error +
         R"(,"metadata":"{\"local_rank\":0}","agent_restarts":0}})" + "\n";
}

TEST_F(TimelineTest, DrawsEachWorkerTheFailureAndTheRestartOfARealRun) {
  fs::path script = write(
      "w.sh",
      "#!/bin/sh\n"
      "if [ \"$LOCAL_RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; "
      "then sleep 0.2; exit 1; fi\n"
      "sleep 0.2\n");
  fs::permissions(script, fs::perms::owner_all);
  fs::path events = dir_ / "events.jsonl";
  auto [code, out] =
      run({TIDERUN_BIN,
           "--log-dir",
           (dir_ / "logs").string(),
           "--standalone",
           "--nproc-per-node=3",
           "--max-restarts=1",
           "--events",
           "jsonl:" + events.string(),
           script.string()},
          60s);
  ASSERT_EQ(code, 0) << out;

  fs::path svg_path = dir_ / "timeline.svg";
  auto [tl_code, tl_out] =
      timeline({events.string(), "-o", svg_path.string(), "--title", "run"});
  ASSERT_EQ(tl_code, 0) << tl_out;
  EXPECT_EQ(tl_out, "");
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  EXPECT_EQ(count(svg, "<g class=\"lane\""), 3u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar failed\""), 1u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar terminated\""), 2u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar succeeded\""), 3u) << svg;
  EXPECT_NE(svg.find("exited with code 1"), std::string::npos) << svg;
  EXPECT_NE(svg.find("restart: worker failure"), std::string::npos) << svg;
  EXPECT_NE(svg.find("rendezvous: world size 1"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">attempt 1<"), std::string::npos) << svg;

  // The same picture as a page.
  fs::path html_path = dir_ / "timeline.html";
  auto [html_code, html_out] =
      timeline({events.string(), "-o", html_path.string()});
  ASSERT_EQ(html_code, 0) << html_out;
  std::string html = read(html_path);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u) << html.substr(0, 200);
  EXPECT_NE(html.find("<svg xmlns="), std::string::npos);
  EXPECT_EQ(count(html, "<g class=\"lane\""), 3u);
  EXPECT_TRUE(html.ends_with("</html>\n"));
}

TEST_F(TimelineTest, SkipsAMalformedLineWithAWarningAndIgnoresUnknownOnes) {
  fs::path events = write(
      "events.jsonl",
      worker_event("HEALTHY", 1'700'000'000'000, 0, "11") +
          "this is not json {\n" +
          R"({"hello":"a line some other tool wrote"})" + "\n" +
          R"({"name":"torchelastic.agent.brand_new","source":"AGENT",)" +
          R"("timestamp":1700000000100,"metadata":{}})" + "\n" +
          worker_event("SUCCEEDED", 1'700'000'000'500, 0, "11"));
  fs::path svg_path = dir_ / "t.svg";
  auto [code, out] = timeline({events.string(), "-o", svg_path.string()});
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(
      out.find("events.jsonl:2: skipped: not a JSON object"), std::string::npos)
      << out;
  EXPECT_EQ(count(out, "skipped"), 1u) << out;
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  EXPECT_EQ(count(svg, "<g class=\"lane\""), 1u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar succeeded\""), 1u) << svg;
}

TEST_F(TimelineTest, AFileWithoutEventsOrMissingExitsOneSayingWhy) {
  fs::path svg_path = dir_ / "t.svg";
  auto [empty_code, empty_out] =
      timeline({write("empty.jsonl", "").string(), "-o", svg_path.string()});
  EXPECT_EQ(empty_code, 1) << empty_out;
  EXPECT_NE(empty_out.find("no events in"), std::string::npos) << empty_out;

  auto [junk_code, junk_out] = timeline(
      {write("junk.jsonl", "garbage\n[1,2]\n").string(),
       "-o",
       svg_path.string()});
  EXPECT_EQ(junk_code, 1) << junk_out;
  EXPECT_NE(junk_out.find("no events in"), std::string::npos) << junk_out;
  EXPECT_NE(junk_out.find("2 malformed"), std::string::npos) << junk_out;

  auto [missing_code, missing_out] =
      timeline({(dir_ / "nope.jsonl").string(), "-o", svg_path.string()});
  EXPECT_EQ(missing_code, 1) << missing_out;
  EXPECT_NE(missing_out.find("cannot read"), std::string::npos) << missing_out;
  EXPECT_NE(missing_out.find("No such file"), std::string::npos) << missing_out;
  EXPECT_FALSE(fs::exists(svg_path));

  auto [flag_code, flag_out] = timeline({(dir_ / "nope.jsonl").string()});
  EXPECT_EQ(flag_code, 2) << flag_out;
}

TEST_F(TimelineTest, ShowsTorchsErrorMessageEscapedForXml) {
  std::string torch_error =
      R"("{\"message\": {\"message\": \"RuntimeError: <b>boom</b> & \\\"x\\\"\", )"
      R"(\"extraInfo\": {\"py_callstack\": \"Traceback...\", \"timestamp\": \"1\"}}}")";
  fs::path events = write(
      "events.jsonl",
      worker_event("HEALTHY", 1'700'000'000'000, 0, "11") +
          worker_event("FAILED", 1'700'000'001'000, 0, "11", torch_error));
  fs::path svg_path = dir_ / "t.svg";
  auto [code, out] = timeline(
      {events.string(), "-o", svg_path.string(), "--title", "a <b> & 'c'"});
  ASSERT_EQ(code, 0) << out;
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  EXPECT_NE(
      svg.find(">RuntimeError: &lt;b&gt;boom&lt;/b&gt; &amp; &quot;x&quot;<"),
      std::string::npos)
      << svg;
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &apos;c&apos;"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  EXPECT_EQ(svg.find("py_callstack\"<"), std::string::npos);
}

TEST_F(
    TimelineTest, DrawsTheLastRunWithTimersRendezvousFailuresAndLiveWorkers) {
  const int64_t t = 1'700'000'000'000;
  std::string timer = R"({"name":"torchelastic.agent.timer_expired",)"
                      R"("source":"AGENT","timestamp":1700000000400,)"
                      R"("metadata":{"run_id":"r1","hostname":"h1",)"
                      R"("worker_id":"12","scope_id":"step",)"
                      R"("overrun_ms":250,"signal":9}})"
                      "\n";
  std::string rdzv_failed =
      R"({"event_type":"rdzv","name":"x","run_id":"r1","message":)"
      R"("store unreachable","hostname":"h1","pid":5,"node_state":"FAILED",)"
      R"("master_endpoint":"","rank":null,"local_id":null,)"
      R"("error_trace":"","timestamp":1700000000600})"
      "\n";
  fs::path events = write(
      "events.jsonl",
      // An earlier run appended to the same file.
      worker_event("HEALTHY", t - 9000, 5, "1", "null", "r0") +
          worker_event("SUCCEEDED", t - 8000, 5, "1", "null", "r0") +
          worker_event("HEALTHY", t, 0, "11") +
          worker_event("HEALTHY", t, 1, "12") + timer +
          worker_event(
              "FAILED",
              t + 500,
              1,
              "12",
              R"x("killed by signal 9 (SIGKILL)")x") +
          worker_event("TERMINATED", t + 500, 0, "11") + rdzv_failed +
          worker_event("HEALTHY", t + 700, 0, "21") +
          worker_event("HEALTHY", t + 700, 1, "22") +
          worker_event("HEALTHY", t + 900, 1, "22"));
  fs::path svg_path = dir_ / "t.svg";
  auto [code, out] = timeline({events.string(), "-o", svg_path.string()});
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("holds 2 runs; drawing the last, r1"), std::string::npos)
      << out;
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  EXPECT_EQ(count(svg, "<g class=\"lane\""), 2u) << svg;
  EXPECT_EQ(svg.find("pid 1<"), std::string::npos) << svg;
  EXPECT_EQ(count(svg, "class=\"bar running\""), 2u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar failed\""), 1u) << svg;
  EXPECT_NE(svg.find(">killed by signal 9 (SIGKILL)<"), std::string::npos);
  EXPECT_NE(
      svg.find(">timer expired: step +250 ms, SIGKILL<"), std::string::npos)
      << svg;
  EXPECT_NE(
      svg.find(">rendezvous failed: store unreachable<"), std::string::npos)
      << svg;
  EXPECT_NE(svg.find("still running at end of file"), std::string::npos);

  auto [other_code, other_out] =
      timeline({events.string(), "-o", svg_path.string(), "--run-id", "r0"});
  ASSERT_EQ(other_code, 0) << other_out;
  EXPECT_EQ(count(read(svg_path), "class=\"bar succeeded\""), 1u);
  auto [bad_code, bad_out] =
      timeline({events.string(), "-o", svg_path.string(), "--run-id", "r9"});
  EXPECT_EQ(bad_code, 1);
  EXPECT_NE(bad_out.find("no events of run r9"), std::string::npos) << bad_out;
}

}  // namespace
}  // namespace tide
