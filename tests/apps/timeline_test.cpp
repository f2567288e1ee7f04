// tide-timeline as a user runs it: on a real tiderun events file, on files
// with junk in them, on files it cannot use, and on a job of many nodes and
// ranks written by hand; as a picture, a page and a trace.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
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

  // The picture's height, from its root element.
  static double svg_height(const std::string& svg) {
    std::smatch m;
    EXPECT_TRUE(
        std::regex_search(svg, m, std::regex("<svg [^>]*height=\"([0-9.]+)\"")))
        << svg.substr(0, 400);
    return m.empty() ? -1 : std::stod(m[1]);
  }

  // The content of the first <text> element that starts with prefix.
  static std::string text_starting(
      const std::string& svg, const std::string& prefix) {
    for (size_t at = svg.find("<text"); at != std::string::npos;
         at = svg.find("<text", at + 1)) {
      size_t start = svg.find('>', at) + 1;
      std::string content =
          svg.substr(start, svg.find("</text>", start) - start);
      if (content.rfind(prefix, 0) == 0) {
        return content;
      }
    }
    return "";
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

// Where a worker runs, as its status events say.
struct Place {
  std::string host = "h1";
  int group_rank = 0;
  int local_rank = 0;
  int restarts = 0;  // the agent's, when the event is written
  std::string role = "default";
  std::string run_id = "r1";
};

// A worker's HEALTHY or end event, in tiderun's layout.
std::string status_event(
    const std::string& state,
    int64_t t_ms,
    int rank,
    const std::string& pid,
    const Place& at,
    const std::string& raw_error = "null") {
  return R"({"name":"torchelastic.worker.status.)" + state +
         R"(","source":"AGENT","timestamp":)" + std::to_string(t_ms) +
         R"(,"metadata":{"run_id":")" + at.run_id + R"(","global_rank":)" +
         std::to_string(rank) + R"(,"group_rank":)" +
         std::to_string(at.group_rank) + R"(,"worker_id":")" + pid +
         R"(","role":")" + at.role + R"(","hostname":")" + at.host +
         R"(","state":")" + state + R"(","raw_error":)" + raw_error +
         R"(,"metadata":"{\"local_rank\":)" + std::to_string(at.local_rank) +
         R"(}","agent_restarts":)" + std::to_string(at.restarts) + "}}\n";
}

std::string worker_event(
    const std::string& state,
    int64_t t_ms,
    int rank,
    const std::string& pid,
    const std::string& raw_error = "null",
    const std::string& run_id = "r1") {
  return status_event(state, t_ms, rank, pid, {.run_id = run_id}, raw_error);
}

// An agent's event (torchelastic.agent.WHAT); fields: more JSON members.
std::string agent_event(
    const std::string& what,
    int64_t t_ms,
    const Place& at,
    const std::string& fields) {
  return R"({"name":"torchelastic.agent.)" + what +
         R"(","source":"AGENT","timestamp":)" + std::to_string(t_ms) +
         R"(,"metadata":{"run_id":")" + at.run_id + R"(","hostname":")" +
         at.host + R"(","group_rank":)" + std::to_string(at.group_rank) +
         R"(,"agent_restarts":)" + std::to_string(at.restarts) + "," + fields +
         "}}\n";
}

// A job of `nodes` hosts (node0, node1, ...) with `ranks` workers each: in
// attempt 0, rank `failing` fails and the agents stop the others; attempt 1
// succeeds.
std::string job_events(int nodes, int ranks, int failing) {
  const int64_t t = 1'700'000'000'000;
  std::string out;
  auto pid = [&](int rank, int attempt) {
    return std::to_string(10000 * (attempt + 1) + rank);
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    int64_t start = t + 4000 * attempt;
    for (int node = 0; node < nodes; ++node) {
      Place agent{
          .host = "node" + std::to_string(node),
          .group_rank = node,
          .restarts = attempt};
      if (attempt > 0) {
        out += agent_event(
            "restart",
            start - 100,
            agent,
            R"("reason":"worker failure","remaining_restarts":2)");
      }
      out += agent_event(
          "rendezvous",
          start,
          agent,
          R"("group_world_size":)" + std::to_string(nodes) +
              R"(,"duration_ms":80,"master_endpoint":"node0:29500")");
    }
    for (const char* state : {"HEALTHY", "END"}) {
      for (int rank = 0; rank < nodes * ranks; ++rank) {
        Place at{
            .host = "node" + std::to_string(rank / ranks),
            .group_rank = rank / ranks,
            .local_rank = rank % ranks,
            .restarts = attempt};
        if (std::string(state) == "HEALTHY") {
          out += status_event(
              "HEALTHY", start + 100, rank, pid(rank, attempt), at);
        } else if (attempt == 1) {
          out +=
              status_event("SUCCEEDED", start + 3000, rank, pid(rank, 1), at);
        } else if (rank == failing) {
          out += status_event(
              "FAILED",
              start + 2000,
              rank,
              pid(rank, 0),
              at,
              R"("exited with code 1")");
        } else {
          out +=
              status_event("TERMINATED", start + 2100, rank, pid(rank, 0), at);
        }
      }
    }
  }
  return out;
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

  // The same run as a trace: a process for the node, a thread for its agent
  // and one per rank, a complete event per worker process.
  fs::path trace_path = dir_ / "trace.json";
  auto [trace_code, trace_out] =
      timeline({events.string(), "-o", trace_path.string()});
  ASSERT_EQ(trace_code, 0) << trace_out;
  json trace = json::parse(read(trace_path), nullptr, false);
  ASSERT_TRUE(trace.is_object()) << read(trace_path);
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  std::string host;
  std::istringstream lines(read(events));
  for (std::string line; host.empty() && std::getline(lines, line);) {
    json e = json::parse(line, nullptr, false);
    if (e.is_object() && e.contains("metadata") &&
        e["metadata"].contains("hostname")) {
      host = e["metadata"]["hostname"];
    }
  }
  std::vector<std::string> processes;
  std::set<std::string> threads;
  std::map<std::string, int> workers;  // outcome -> complete events
  std::set<std::string> instants;
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name"))
        << e;
    EXPECT_GT(e["pid"].get<int>(), 0) << e;
    if (e["ph"] == "M" && e["name"] == "process_name") {
      processes.push_back(e["args"]["name"]);
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      threads.insert(e["args"]["name"].get<std::string>());
    } else if (e["ph"] == "X" && e["cat"] == "worker") {
      ++workers[e["name"]];
      EXPECT_GE(e["ts"].get<int64_t>(), 0) << e;
      EXPECT_GT(e["dur"].get<int64_t>(), 0) << e;
      EXPECT_TRUE(e["args"]["pid"].is_number_integer()) << e;
      EXPECT_EQ(e["args"]["outcome"], e["name"]) << e;
      if (e["name"] == "failed") {
        EXPECT_EQ(e["args"]["attempt"], 0) << e;
        EXPECT_NE(
            e["args"]["error"].get<std::string>().find("exited with code 1"),
            std::string::npos)
            << e;
      }
    } else if (e["ph"] == "i") {
      instants.insert(e["name"].get<std::string>());
    }
  }
  EXPECT_EQ(processes, std::vector<std::string>{host});
  EXPECT_EQ(
      threads, (std::set<std::string>{"agent", "rank 0", "rank 1", "rank 2"}));
  EXPECT_EQ(
      workers,
      (std::map<std::string, int>{
          {"failed", 1}, {"terminated", 2}, {"succeeded", 3}}));
  EXPECT_TRUE(instants.count("restart")) << trace.dump(1);
  EXPECT_TRUE(instants.count("attempt 1")) << trace.dump(1);
  EXPECT_NE(trace.dump().find("\"name\":\"rendezvous\""), std::string::npos);
}

// A job view (tiderun status --json) in place of an events file: each
// node's recorded attempts, in each format, as the live page draws them.
TEST_F(TimelineTest, DrawsAJobViewAsThePageDoes) {
  json view = {
      {"run_id", "r9"},
      {"now", 1.8e9},
      {"state", "FAILED"},
      {"nodes",
       {{{"node", "n0"},
         {"slot", 0},
         {"group_rank", 0},
         {"ranks", {{{"rank", 0}}}},
         {"attempts",
          {{{"attempt", 0},
            {"round", 1},
            {"start", 1.8e9 - 20},
            {"end", 1.8e9 - 5},
            {"outcome", "FAILED"},
            {"reason", "rank 0 (local 0) exited with code 3"}}}}}}}};
  fs::path job = write("job.json", view.dump());
  fs::path svg_path = dir_ / "job.svg";
  auto [code, out] = timeline({job.string(), "-o", svg_path.string()});
  ASSERT_EQ(code, 0) << out;
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  EXPECT_EQ(count(svg, R"(data-attempt="0" data-outcome="FAILED")"), 1u) << svg;
  EXPECT_NE(svg.find("exited with code 3"), std::string::npos) << svg;
  EXPECT_NE(svg.find("job FAILED"), std::string::npos) << svg;

  fs::path html_path = dir_ / "job.html";
  auto [html_code, html_out] =
      timeline({job.string(), "-o", html_path.string()});
  ASSERT_EQ(html_code, 0) << html_out;
  EXPECT_EQ(count(read(html_path), "<g class=\"attempts-lane\""), 1u);

  fs::path trace_path = dir_ / "job.trace.json";
  auto [trace_code, trace_out] =
      timeline({job.string(), "-o", trace_path.string()});
  ASSERT_EQ(trace_code, 0) << trace_out;
  json trace = json::parse(read(trace_path));
  int attempts = 0;
  for (const json& e : trace["traceEvents"]) {
    attempts += e["ph"] == "X" && e["cat"] == "attempt" ? 1 : 0;
  }
  EXPECT_EQ(attempts, 1) << trace.dump(1);

  // A view of another run than asked for, and a view without its time.
  auto [other, other_out] =
      timeline({job.string(), "-o", svg_path.string(), "--run-id", "r1"});
  EXPECT_EQ(other, 1);
  EXPECT_NE(other_out.find("view of run 'r9', not 'r1'"), std::string::npos)
      << other_out;
  view["now"] = "later";
  auto [bad, bad_out] = timeline(
      {write("bad.json", view.dump()).string(), "-o", svg_path.string()});
  EXPECT_EQ(bad, 1) << bad_out;
}

TEST_F(TimelineTest, GroupsLanesPerNodeAndDrawsABigNodeAsOneSummaryLane) {
  fs::path events = write("events.jsonl", job_events(2, 64, 70));
  fs::path svg_path = dir_ / "t.svg";
  auto [code, out] = timeline({events.string(), "-o", svg_path.string()});
  ASSERT_EQ(code, 0) << out;
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  // 128 lanes would be 3,500 px; two nodes of one summary lane each are not.
  EXPECT_LT(svg_height(svg), 600) << svg;
  EXPECT_EQ(count(svg, "<g class=\"node closed\""), 2u) << svg;
  EXPECT_EQ(count(svg, "<g class=\"summary-lane\""), 2u) << svg;
  EXPECT_EQ(count(svg, "<g class=\"lane\""), 0u) << svg;
  // Each node's group: its header, its agent's lane, then its summary.
  size_t node0 = svg.find("<g class=\"node closed\" data-host=\"node0\"");
  size_t node1 = svg.find("<g class=\"node closed\" data-host=\"node1\"");
  ASSERT_LT(node0, node1);
  std::string group0 = svg.substr(node0, node1 - node0);
  EXPECT_NE(group0.find("64 workers<"), std::string::npos) << group0;
  EXPECT_LT(
      group0.find("class=\"agent-lane\""),
      group0.find("class=\"summary-lane\""));
  EXPECT_NE(svg.find(">ranks 64\u2013127<"), std::string::npos) << svg;
  // A node's attempt is as bad as its worst worker: node1 failed attempt 0.
  EXPECT_EQ(count(svg, "class=\"bar failed\""), 1u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar terminated\""), 1u) << svg;
  EXPECT_EQ(count(svg, "class=\"bar succeeded\""), 2u) << svg;
  EXPECT_NE(svg.find(">rank 70: exited with code 1<"), std::string::npos)
      << svg;
  EXPECT_EQ(svg.find("<script"), std::string::npos);

  auto [expand_code, expand_out] =
      timeline({events.string(), "-o", svg_path.string(), "--expand"});
  ASSERT_EQ(expand_code, 0) << expand_out;
  std::string expanded = read(svg_path);
  expect_svg_document(expanded);
  EXPECT_EQ(count(expanded, "<g class=\"node\""), 2u);
  EXPECT_EQ(count(expanded, "<g class=\"lane\""), 128u);
  EXPECT_EQ(count(expanded, "<g class=\"summary-lane\""), 0u);
  EXPECT_GT(svg_height(expanded), 128 * 28);

  // The page holds both ways of each node, the summary shown, and the
  // script that switches them: inline, nothing fetched.
  fs::path html_path = dir_ / "t.html";
  auto [html_code, html_out] =
      timeline({events.string(), "-o", html_path.string()});
  ASSERT_EQ(html_code, 0) << html_out;
  std::string html = read(html_path);
  EXPECT_EQ(count(html, "<g class=\"node closed\""), 2u);
  EXPECT_EQ(count(html, "<g class=\"lane\""), 128u);
  EXPECT_EQ(count(html, "<g class=\"summary-lane\""), 2u);
  EXPECT_EQ(count(html, "<g class=\"node-header\""), 2u);
  EXPECT_EQ(count(html, "<script>"), 1u);
  EXPECT_EQ(count(html, "src="), 0u);
  EXPECT_EQ(count(html, "https:"), 0u);
  EXPECT_EQ(count(html, "http:"), count(html, "http://www.w3.org/2000/svg"));
  EXPECT_LT(svg_height(html), 600);

  // The trace: a process per node, a thread per rank and one per agent.
  fs::path trace_path = dir_ / "t.json";
  auto [trace_code, trace_out] =
      timeline({events.string(), "-o", trace_path.string()});
  ASSERT_EQ(trace_code, 0) << trace_out;
  json trace = json::parse(read(trace_path), nullptr, false);
  ASSERT_TRUE(trace.is_object());
  std::map<int, std::string> processes;
  std::map<int, int> threads;  // pid -> threads named
  for (const json& e : trace["traceEvents"]) {
    if (e["name"] == "process_name") {
      processes[e["pid"]] = e["args"]["name"];
    } else if (e["name"] == "thread_name") {
      ++threads[e["pid"]];
    }
  }
  EXPECT_EQ(
      processes, (std::map<int, std::string>{{1, "node0"}, {2, "node1"}}));
  EXPECT_EQ(threads, (std::map<int, int>{{1, 65}, {2, 65}}));
}

TEST_F(
    TimelineTest,
    ShortensALabelWithoutRoomWithAnEllipsisKeepingItInItsTooltip) {
  std::string message = "RuntimeError: the loss went to NaN";
  for (int i = 0; i < 12; ++i) {
    message += "; then step " + std::to_string(i) + " went wrong as well";
  }
  const int64_t t = 1'700'000'000'000;
  fs::path events = write(
      "events.jsonl",
      worker_event("HEALTHY", t, 0, "11") +
          worker_event("FAILED", t + 1000, 0, "11", json(message).dump()));
  fs::path svg_path = dir_ / "t.svg";
  auto [code, out] = timeline({events.string(), "-o", svg_path.string()});
  ASSERT_EQ(code, 0) << out;
  std::string svg = read(svg_path);
  expect_svg_document(svg);
  std::string label = text_starting(svg, "RuntimeError: the loss");
  ASSERT_TRUE(label.ends_with("\u2026")) << svg;
  std::string kept = label.substr(0, label.size() - 3);
  EXPECT_EQ(message.rfind(kept, 0), 0u) << label;
  EXPECT_LT(kept.size(), message.size());
  EXPECT_GT(kept.size(), 100u) << "cut far shorter than its room: " << label;
  EXPECT_NE(svg.find("<title>" + message + "\n"), std::string::npos) << svg;
  EXPECT_NE(svg.find("font-family=\"DejaVu Sans, Verdana"), std::string::npos);
}

TEST_F(TimelineTest, SizesTheColumnOfLaneNamesToTheLongestName) {
  const int64_t t = 1'700'000'000'000;
  Place trainer{.role = "trainer"};
  Place server{.role = "parameter-server-for-the-embedding-tables"};
  fs::path events = write(
      "events.jsonl",
      status_event("HEALTHY", t, 0, "11", trainer) +
          status_event("HEALTHY", t, 1, "12", server) +
          status_event("SUCCEEDED", t + 1000, 0, "11", trainer) +
          status_event("SUCCEEDED", t + 1000, 1, "12", server));
  fs::path svg_path = dir_ / "t.svg";
  auto [code, out] = timeline({events.string(), "-o", svg_path.string()});
  ASSERT_EQ(code, 0) << out;
  std::string svg = read(svg_path);
  EXPECT_NE(
      svg.find(">local 0 \u00b7 parameter-server-for-the-embedding-tables<"),
      std::string::npos)
      << svg;
  // The bars start right of the name.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      svg, m, std::regex("<rect x=\"([0-9.]+)\"[^>]*class=\"bar ")));
  EXPECT_GT(std::stod(m[1]), 300) << svg;
}

TEST_F(
    TimelineTest,
    ClickingANodesHeaderInThePageShowsItsWorkersAndMovesTheNodesBelow) {
  const char* env = std::getenv("TIDE_CHROMIUM");
  std::string chromium = env && *env ? env : "/usr/bin/chromium";
  if (!fs::exists(chromium)) {
    GTEST_SKIP() << "no chromium at " << chromium << " (set TIDE_CHROMIUM)";
  }
  fs::path events = write("events.jsonl", job_events(2, 20, 3));
  fs::path html_path = dir_ / "t.html";
  auto [code, out] = timeline({events.string(), "-o", html_path.string()});
  ASSERT_EQ(code, 0) << out;
  std::string html = read(html_path);
  // As a user would: a click on node0's header once the page has loaded.
  std::string click =
      "<script>document.querySelector('g.node[data-host=\"node0\"] "
      ".node-header').dispatchEvent(new MouseEvent('click'));</script>";
  html.insert(html.rfind("</body>"), click);
  fs::path clicked = write("clicked.html", html);
  fs::path profile = dir_ / "profile";
  fs::path log = dir_ / "chromium.log";
  auto [dom_code, dom] =
      run({"/bin/sh",
           "-c",
           "exec \"$0\" \"$@\" 2>" + log.string(),
           chromium,
           "--headless",
           "--no-sandbox",
           "--disable-gpu",
           "--disable-dev-shm-usage",
           "--no-first-run",
           "--disable-extensions",
           "--disable-background-networking",
           "--user-data-dir=" + profile.string(),
           "--virtual-time-budget=2000",
           "--dump-dom",
           "file://" + clicked.string()},
          90s);
  ASSERT_EQ(dom_code, 0) << read(log);
  // node0 is open, and node1 moved down by what opening node0 added.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      dom,
      m,
      std::regex("<g class=\"node\" data-host=\"node0\" "
                 "data-top=\"[0-9.]+\" data-open-height=\"([0-9.]+)\" "
                 "data-closed-height=\"([0-9.]+)\"")))
      << dom;
  // 20 lanes in place of one.
  double added = std::stod(m[1]) - std::stod(m[2]);
  EXPECT_GE(added, 19 * 28);
  ASSERT_TRUE(std::regex_search(
      dom,
      m,
      std::regex("<g class=\"node closed\" data-host=\"node1\"[^>]*"
                 "transform=\"translate\\(0 ([0-9.]+)\\)\"")))
      << dom;
  EXPECT_NEAR(std::stod(m[1]), added, 0.5);
  EXPECT_NEAR(svg_height(dom), svg_height(html) + added, 1) << dom;
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
