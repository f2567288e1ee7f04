// tide-timeline: draws a run's structured events (tiderun --events
// jsonl:PATH) as one picture: a lane per worker with each worker's lifetime
// coloured by outcome, and the agent's rendezvous rounds, restarts, timer
// expiries and failure messages on the same time axis. Writes a
// self-contained SVG, or an HTML page around it when the output ends in .html.
//
//   tide-timeline EVENTS.jsonl -o OUT.svg [--title TEXT] [--run-id ID]
//
// Exits 0 when the picture is written, 1 when the events cannot be read, hold
// no events or the output cannot be written, 2 on bad flags. Lines that are
// not JSON objects are skipped with a warning on stderr; JSON lines that are
// not events, and events of unknown names, are skipped silently.
//
// The program's parts: events.h (reading the file), model.h (the timeline
// it describes), render.h (the SVG), text.h (text for the picture).
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
#include "tide-timeline/events.h"
#include "tide-timeline/model.h"
#include "tide-timeline/render.h"
#include "tide-timeline/text.h"

namespace {

using namespace tide::timeline;

bool ends_with_html(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  return ext == ".html" || ext == ".htm";
}

}  // namespace

int main(int argc, char** argv) {
  std::string input_path;
  std::string output_path;
  std::string title;
  std::string run_id;
  CLI::App app{
      "tide-timeline: draw a run's events file (tiderun --events jsonl:PATH) "
      "as an SVG timeline, or an HTML page when OUT ends in .html",
      "tide-timeline"};
  app.add_option("events", input_path, "events file, one JSON object a line")
      ->required();
  app.add_option("-o,--output", output_path, "the .svg or .html to write")
      ->required();
  app.add_option("--title", title, "heading (default: the events file's name)");
  app.add_option(
      "--run-id",
      run_id,
      "the run to draw when the file holds several (default: the last)");
  if (auto done = tide::apps::parse_command_line(app, argc, argv)) {
    return *done;
  }

  try {
    Warnings warnings(input_path);
    Input input = read_events(input_path, warnings);
    std::vector<Record> records =
        select_run(std::move(input.records), input_path, run_id);
    if (records.empty()) {
      throw Fatal(
          "no events in " + input_path + " (" + std::to_string(input.lines) +
          " lines, " + std::to_string(input.malformed) +
          " malformed); write one with tiderun --events jsonl:PATH");
    }
    std::stable_sort(
        records.begin(), records.end(), [](const Record& a, const Record& b) {
          return a.t_ms < b.t_ms;
        });
    Timeline tl = build_timeline(records, warnings);
    tl.run_id = run_id;
    if (title.empty()) {
      title = "Timeline of " +
              std::filesystem::path(input_path).filename().string();
    }
    std::string svg = render_svg(tl, title);
    std::ofstream out(output_path, std::ios::binary | std::ios::trunc);
    if (ends_with_html(output_path)) {
      out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta "
             "charset=\"utf-8\">\n"
          << "<title>" << xml(title) << "</title>\n"
          << "<style>body { margin: 16px; background: #ffffff; }</style>\n"
          << "</head>\n<body>\n"
          << svg << "</body>\n</html>\n";
    } else {
      out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" << svg;
    }
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
