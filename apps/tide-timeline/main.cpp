// tide-timeline: draws a run's structured events (tiderun --events
// jsonl:PATH) as one picture: per node, its agent's lane (rendezvous rounds,
// restarts, failures) heading a lane per worker with each worker's lifetime
// coloured by outcome, timer expiries and hangs on the same time axis; a
// node of many workers as one summary lane. Writes a self-contained SVG, an
// HTML page around it whose nodes open and close (.html), or the run as a
// Chrome / Perfetto trace (.json). Given a job view instead (tiderun status
// --json), draws each node's recorded attempts and restarts up to the
// view's "now", as the live page does.
//
//   tide-timeline EVENTS.jsonl|JOB.json -o OUT.svg|OUT.html|OUT.json
//       [--title TEXT] [--run-id ID] [--expand] [--format svg|html|trace]
//
// Exits 0 when the picture is written, 1 when the input cannot be read,
// holds no events or the output cannot be written, 2 on bad flags. Lines
// that are not JSON objects are skipped with a warning on stderr; JSON lines
// that are not events, and events of unknown names, are skipped silently.
//
// The picture is the timeline part (src/timeline): events.h (reading the
// file), job_view.h (a job view), model.h (the timeline), nodes.h, render.h
// (the SVG), html.h (the page), trace.h (the trace).
#include <errno.h>
#include <string.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli.h"
#include "timeline/events.h"
#include "timeline/html.h"
#include "timeline/job_view.h"
#include "timeline/model.h"
#include "timeline/nodes.h"
#include "timeline/render.h"
#include "timeline/trace.h"

namespace {

using namespace tide::timeline;

// The format the output's name asks for: .html or .htm a page, .json a
// trace, anything else an SVG.
std::string format_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  return ext == ".html" || ext == ".htm" ? "html"
         : ext == ".json"                ? "trace"
                                         : "svg";
}

// The timeline of a job view, or of one run of an events file.
Timeline read_timeline(const std::string& path, std::string& run_id) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Fatal("cannot read " + path + ": " + ::strerror(errno));
  }
  std::string text{
      std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (auto view = as_job_view(text)) {
    Timeline tl = timeline_of_job(*view);
    if (!run_id.empty() && run_id != tl.run_id) {
      throw Fatal(
          path + " is the view of run '" + tl.run_id + "', not '" + run_id +
          "'");
    }
    return tl;
  }
  Warnings warnings(path);
  Input input = read_events(path, warnings);
  std::vector<Record> records =
      select_run(std::move(input.records), path, run_id);
  if (records.empty()) {
    throw Fatal(
        "no events in " + path + " (" + std::to_string(input.lines) +
        " lines, " + std::to_string(input.malformed) +
        " malformed); write one with tiderun --events jsonl:PATH, or a job "
        "view with tiderun status --json");
  }
  std::stable_sort(
      records.begin(), records.end(), [](const Record& a, const Record& b) {
        return a.t_ms < b.t_ms;
      });
  Timeline tl = build_timeline(records, warnings);
  tl.run_id = run_id;
  return tl;
}

}  // namespace

int main(int argc, char** argv) {
  std::string input_path;
  std::string output_path;
  std::string title;
  std::string run_id;
  std::string format;
  bool expand = false;
  CLI::App app{
      "tide-timeline: draw a run's events file (tiderun --events jsonl:PATH) "
      "as an SVG timeline, an HTML page when OUT ends in .html, or a Chrome / "
      "Perfetto trace when it ends in .json",
      "tide-timeline"};
  app.add_option(
         "input",
         input_path,
         "events file (one JSON object a line), or a job view (tiderun "
         "status --json)")
      ->required();
  app.add_option(
         "-o,--output", output_path, "the .svg, .html or .json to write")
      ->required();
  app.add_option(
         "--format", format, "svg, html or trace (default: by OUT's extension)")
      ->check(CLI::IsMember({"svg", "html", "trace"}));
  app.add_flag(
      "--expand",
      expand,
      "draw every worker's lane (by default a node of more than " +
          std::to_string(kCollapseAbove) + " workers is one summary lane)");
  app.add_option("--title", title, "heading (default: the events file's name)");
  app.add_option(
      "--run-id",
      run_id,
      "the run to draw when the file holds several (default: the last)");
  if (auto done = tide::apps::parse_command_line(app, argc, argv)) {
    return *done;
  }

  try {
    Timeline tl = read_timeline(input_path, run_id);
    if (title.empty()) {
      title = "Timeline of " +
              std::filesystem::path(input_path).filename().string();
    }
    if (format.empty()) {
      format = format_of(output_path);
    }
    RenderOptions options{.expand = expand};
    std::string text = format == "html" ? render_html(tl, title, options)
                       : format == "trace"
                           ? render_trace(tl, title)
                           : "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" +
                                 render_svg(tl, title, options);
    std::ofstream out(output_path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      throw Fatal("cannot write " + output_path + ": " + ::strerror(errno));
    }
  } catch (const Fatal& e) {
    std::fprintf(stderr, "tide-timeline: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
