#include "timeline/render.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "timeline/font.h"
#include "timeline/layout.h"
#include "timeline/nodes.h"
#include "timeline/svg.h"
#include "timeline/text.h"

namespace tide::timeline {
namespace {

constexpr double kNoteRow = 17;  // agent lane rows
constexpr double kTextRow = 14;  // text rows under a worker's bars
constexpr double kBarHeight = 16;
constexpr double kNameX = 28;  // where lane names start
// The column of lane names: as wide as the longest, within these bounds.
constexpr double kMinNameColumn = 120;
constexpr double kMaxNameColumn = 420;
constexpr double kBelowLanes = 52;  // the time axis under the lanes

// Scoped to the picture, so that a page that embeds it (the live job page)
// and the picture do not style each other.
constexpr const char* kStyle = R"(
  .tide-timeline text { font-family: 'DejaVu Sans', Verdana, sans-serif; font-size: 11px; fill: #24292f; }
  .tide-timeline .title { font-size: 18px; font-weight: bold; }
  .tide-timeline .sub { font-size: 12px; fill: #57606a; }
  .tide-timeline .dim { font-size: 10px; fill: #6e7781; }
  .tide-timeline .host { font-size: 12px; font-weight: bold; }
  .tide-timeline .rank { font-size: 12px; font-weight: bold; }
  .tide-timeline .agent { font-style: italic; fill: #57606a; }
  .tide-timeline .zebra { fill: #1f2328; fill-opacity: 0.035; }
  .tide-timeline .grid { stroke: #e1e4e8; stroke-width: 1; }
  .tide-timeline .axis { stroke: #57606a; stroke-width: 1; }
  .tide-timeline .boundary { stroke: #57606a; stroke-width: 1.2; stroke-dasharray: 6 4; }
  .tide-timeline .battempt { font-size: 11px; font-weight: bold; fill: #57606a; }
  .tide-timeline .succeeded { fill: #2da44e; }
  .tide-timeline .failed { fill: #cf222e; }
  .tide-timeline .terminated { fill: #8c959f; }
  .tide-timeline .running { fill: #0969da; }
  .tide-timeline .pid { font-size: 10px; fill: #ffffff; }
  .tide-timeline .err { fill: #cf222e; }
  .tide-timeline .rdzv { fill: #8250df; }
  .tide-timeline .wait { fill: #8250df; opacity: 0.3; }
  .tide-timeline .restart { fill: #e16f24; }
  .tide-timeline .timer { fill: #ffffff; stroke: #9a6700; stroke-width: 2; }
  .tide-timeline .hand { stroke: #9a6700; stroke-width: 1.5; }
  .tide-timeline .timertext { fill: #9a6700; }
  .tide-timeline .hang { fill: #9a6700; }
  .tide-timeline .cross { stroke: #cf222e; stroke-width: 2.5; stroke-linecap: round; }
  .tide-timeline .halo { stroke: #ffffff; stroke-width: 5.5; stroke-linecap: round; }
  .tide-timeline .pending { fill: none; stroke: #8250df; stroke-width: 2; }
  .tide-timeline .label { paint-order: stroke; stroke: #ffffff; stroke-width: 3px; stroke-linejoin: round; }
  .tide-timeline .node.closed > .workers, .tide-timeline .node:not(.closed) > .summary-lane { display: none; }
  .tide-timeline .node-header { cursor: pointer; }
  .tide-timeline .node-header:focus { outline: none; }
  .tide-timeline .hit { fill: transparent; }
  .tide-timeline .node-header:focus-visible .hit { stroke: #0969da; stroke-width: 1.5; }
  .tide-timeline .twisty { font-size: 10px; fill: #57606a; }
  .tide-timeline .node.silent .bar { opacity: 0.45; }
  .tide-timeline .node.silent .host { fill: #6e7781; }
)";

// The widths of the text classes that lane names and headings use.
double rank_width(const std::string& s) {
  return text_width(s, 12, Weight::kBold);
}
double dim_width(const std::string& s) {
  return text_width(s, 10);
}

std::string outcome_text(const Timeline& tl) {
  if (!tl.state.empty()) {
    return "job " + tl.state;
  }
  if (tl.workers.empty()) {
    return "no workers started";
  }
  bool running = false;
  bool failed = false;
  bool all_succeeded = true;
  for (const auto& [key, lane] : tl.workers) {
    Outcome o = lane.bars.back().outcome;
    running = running || o == Outcome::kRunning;
    failed = failed || o == Outcome::kFailed;
    all_succeeded = all_succeeded && o == Outcome::kSucceeded;
  }
  return running         ? "still running at end of file"
         : all_succeeded ? "succeeded"
         : failed        ? "failed"
                         : "stopped";
}

std::string plural(size_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// A bar of a lane: a worker's process, or a node's attempt.
struct LaneBar {
  int64_t attempt = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  Outcome outcome = Outcome::kRunning;
  // Written in the bar: the first of these that fits; the last is shortened
  // to fit when may_shorten.
  std::vector<std::string> texts;
  bool may_shorten = false;
  std::string tooltip;
};

// A lane as drawn: a name in the left column, bars, notes under them.
struct LaneView {
  std::string attrs;  // of its <g>, starting with a blank
  std::string name;
  std::string detail;
  std::vector<LaneBar> bars;
  const std::vector<Note>* notes = nullptr;
  bool striped = false;
};

// Draws a Timeline top to bottom: heading, legend, per node its agent's lane
// and its workers' lanes (or their summary), then the time axis. Layers,
// bottom up: top_ (heading and legend), grid_ (which needs the lanes'
// height), lanes_, bottom_ (the axis), marks_ (attempt boundaries).
class Renderer {
 public:
  Renderer(const Timeline& tl, std::string title, RenderOptions options)
      : tl_(tl),
        nodes_(group_by_node(tl)),
        options_(options),
        name_column_(name_column()),
        axis_(make_axis(tl, name_column_)),
        title_(std::move(title)) {}

  std::string svg() {
    heading();
    legend();
    y_ += 30;
    attempts_y_ = y_;
    y_ += 8;
    lanes_top_ = y_;
    for (const Node& node : nodes_) {
      node_section(node);
    }
    lanes_bottom_ = y_;
    time_axis();
    boundaries();
    std::string w = num(kWidth, 0);
    std::string h = num(lanes_bottom_ + kBelowLanes, 0);
    std::string root =
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"tide-timeline\" "
        "width=\"" +
        w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h +
        "\" font-family=\"" + kFontFamily + "\"";
    if (options_.interactive) {
      root += " data-lanes-top=\"" + num(lanes_top_) +
              "\" data-lanes-bottom=\"" + num(lanes_bottom_) +
              "\" data-below=\"" + num(kBelowLanes) + "\"";
    }
    return root + ">\n<title>" + xml(title_) + "</title>\n<style>" + kStyle +
           "</style>\n<rect width=\"" + w + "\" height=\"" + h +
           "\" fill=\"#ffffff\" class=\"background\"/>\n" + top_.str() +
           grid_.str() + lanes_.str() + "<g class=\"bottom\">\n" +
           bottom_.str() + "</g>\n" + marks_.str() + "</svg>\n";
  }

 private:
  bool collapsed(const Node& node) const {
    return !options_.expand && node.workers.size() > kCollapseAbove;
  }

  std::string worker_detail(const WorkerLane& lane) const {
    std::string detail =
        lane.local_rank ? "local " + std::to_string(*lane.local_rank) : "";
    if (tl_.roles.size() > 1 && !lane.role.empty()) {
      detail += (detail.empty() ? "" : " \u00b7 ") + lane.role;
    }
    return detail;
  }

  // The x where the plot starts: right of the longest lane name, measured,
  // of every lane the picture may show.
  double name_column() const {
    double widest = text_width("agent", 11);
    auto name = [&](const std::string& n, const std::string& detail) {
      widest = std::max(
          widest, rank_width(n) + (detail.empty() ? 0 : 6 + dim_width(detail)));
    };
    for (const Node& node : nodes_) {
      name(plural(workers(node), "worker"), rank_ranges(ranks_of(node)));
      for (const WorkerLane* lane : node.workers) {
        name("rank " + std::to_string(lane->rank), worker_detail(*lane));
      }
    }
    return std::clamp(kNameX + widest + 14, kMinNameColumn, kMaxNameColumn);
  }

  void heading() {
    y_ = 30;
    top_.text(20, y_, fit(title_, kWidth - 40, 18, Weight::kBold), "title");
    const char* dot = " \u00b7 ";
    std::string sub = tl_.run_id.empty() ? "" : "run " + tl_.run_id + dot;
    size_t all = 0;
    size_t hosts = 0;
    for (const Node& node : nodes_) {
      all += workers(node);
      hosts += node.record ? node.record->nodes : workers(node) > 0 ? 1 : 0;
    }
    sub += plural(all, "worker") + " on " + plural(hosts, "host") + dot +
           plural(static_cast<size_t>(tl_.attempts), "attempt") + dot +
           seconds_text(static_cast<double>(tl_.t1 - tl_.t0) / 1000) + dot +
           outcome_text(tl_);
    top_.text(20, y_ += 20, fit(sub, kWidth - 40, 12), "sub");
    std::string hint;
    bool any_collapsed =
        std::any_of(nodes_.begin(), nodes_.end(), [&](const Node& n) {
          return collapsed(n);
        });
    if (options_.interactive && !tl_.workers.empty()) {
      hint = "click a node's header to show or hide its workers' lanes";
      if (any_collapsed) {
        hint += "; nodes of more than " + std::to_string(kCollapseAbove) +
                " workers start as one summary lane";
      }
    } else if (any_collapsed) {
      hint = "nodes of more than " + std::to_string(kCollapseAbove) +
             " workers are drawn as one lane, coloured by each attempt's "
             "worst outcome; tide-timeline --expand draws every worker";
    }
    if (!hint.empty()) {
      top_.text(20, y_ += 16, fit(hint, kWidth - 40, 10), "dim");
    }
  }

  static size_t workers(const Node& node) {
    return node.record ? node.record->ranks.size() : node.workers.size();
  }

  void legend() {
    y_ += 26;
    double x = 20;
    auto item = [&](const std::string& label, auto draw) {
      double w = 28 + text_width(label, kFont);
      if (x + w > kWidth - 20) {
        x = 20;
        y_ += 20;
      }
      draw(x + 8, y_ - 4);
      top_.text(x + 20, y_, label);
      x += w;
    };
    for (auto [o, label] :
         {std::pair{Outcome::kSucceeded, "succeeded"},
          std::pair{Outcome::kFailed, "failed"},
          std::pair{Outcome::kTerminated, "terminated by the agent"},
          std::pair{
              Outcome::kRunning,
              tl_.live ? "running" : "running at end of file"}}) {
      item(label, [&](double cx, double cy) {
        top_.rect(cx - 8, cy - 6, 16, 12, css_class(o), 2);
      });
    }
    for (auto [m, label] :
         {std::pair{Mark::kRendezvous, "rendezvous (band: wait)"},
          std::pair{Mark::kRestart, "restart"},
          std::pair{Mark::kTimer, "timer expired"},
          std::pair{Mark::kHang, "hung"},
          std::pair{Mark::kFailure, "failure"}}) {
      // A job view marks restarts only.
      if (!tl_.live || m == Mark::kRestart) {
        item(label, [&](double cx, double cy) { top_.marker(m, cx, cy); });
      }
    }
    item("attempt boundary", [&](double cx, double cy) {
      top_.line(cx, cy - 8, cx, cy + 8, "boundary");
    });
  }

  // A node's group: its header, its agent's lane, then its workers' lanes
  // or, collapsed, their summary lane; a job view's node, the lane of its
  // recorded attempts. For the page, both, with the heights of the group
  // each way, which its script moves the nodes below by.
  void node_section(const Node& node) {
    bool closed = collapsed(node);
    // A recorded node has no workers' lanes to show or hide.
    bool toggles = options_.interactive && !node.record;
    double top = y_;
    Svg body;
    header(body, node, closed, toggles);
    if (!node.agent_notes.empty()) {
      agent_lane(body, node);
    }
    double lanes_y = y_;
    double summary_height = 0;
    double workers_height = 0;
    if (node.record) {
      lane(body, record_view(node));
      summary_height = workers_height = y_ - lanes_y;
    } else {
      if (!node.workers.empty() && (closed || options_.interactive)) {
        lane(body, summary_view(node));
        summary_height = y_ - lanes_y;
        y_ = lanes_y;
      }
      if (!closed || options_.interactive) {
        body.raw("<g class=\"workers\">\n");
        bool striped = true;
        for (const WorkerLane* w : node.workers) {
          lane(body, worker_view(node, *w, striped));
          striped = !striped;
        }
        body.raw("</g>\n");
        workers_height = y_ - lanes_y;
      }
    }
    y_ = lanes_y + (closed ? summary_height : workers_height);
    bool silent = node.record && node.record->silent;
    lanes_.raw(
        std::string("<g class=\"node") + (closed ? " closed" : "") +
        (silent ? " silent" : "") + "\" data-host=\"" + xml(node.host) + "\"");
    if (options_.interactive) {
      lanes_.raw(
          " data-top=\"" + num(top) + "\" data-open-height=\"" +
          num(lanes_y - top + workers_height) + "\" data-closed-height=\"" +
          num(lanes_y - top + summary_height) + "\"");
    }
    lanes_.raw(">\n" + body.str() + "</g>\n");
  }

  void header(Svg& out, const Node& node, bool closed, bool toggles) {
    out.line(12, y_, kWidth - 12, y_, "grid");
    std::string text = node.host;
    if (node.group_rank) {
      text += "  \u00b7  group rank " + std::to_string(*node.group_rank);
    }
    if (node.record && node.record->nodes > 1) {
      text += "  \u00b7  " + plural(node.record->nodes, "node") + " alike";
    }
    if (workers(node) > 0) {
      text += "  \u00b7  " + plural(workers(node), "worker");
    }
    if (node.record && node.record->silent) {
      text += "  \u00b7  silent for " + seconds_text(node.record->age);
    }
    if (!toggles) {
      out.text(14, y_ + 16, fit(text, kWidth - 28, 12, Weight::kBold), "host");
      y_ += 24;
      return;
    }
    out.raw(
        std::string("<g class=\"node-header\" tabindex=\"0\" role=\"button\" "
                    "aria-expanded=\"") +
        (closed ? "false" : "true") + "\"><title>" + xml(node.host) +
        ": show or hide its workers' lanes</title>\n");
    out.rect(12, y_ + 2, kWidth - 24, 20, "hit", 3);
    out.text(16, y_ + 15, closed ? "\u25b8" : "\u25be", "twisty");
    out.text(28, y_ + 16, fit(text, kWidth - 40, 12, Weight::kBold), "host");
    out.end();
    y_ += 24;
  }

  // A label, with the whole note as its tooltip (which starts with the whole
  // label when the label was shortened).
  void label(Svg& out, const Placed& p, double y, const std::string& cls) {
    out.begin("", p.note->tooltip);
    out.text(p.text_x, y, p.text, cls, p.anchor);
    out.end();
  }

  void agent_lane(Svg& out, const Node& node) {
    RowPacker packer;
    auto placed = place_notes(node.agent_notes, axis_, packer);
    out.begin(
        " class=\"agent-lane\" data-host=\"" + xml(node.host) + "\"",
        "agent on " + node.host);
    out.text(kNameX, y_ + 15, "agent", "agent");
    auto row_y = [&](size_t row) {
      return y_ + 3 + kNoteRow * (static_cast<double>(row) + 0.5);
    };
    // A note without room for its label keeps its marker, in the first row.
    for (const Note& n : node.agent_notes) {
      if (std::none_of(placed.begin(), placed.end(), [&](const Placed& p) {
            return p.note == &n;
          })) {
        out.begin(marker_attrs(n), n.tooltip);
        out.marker(n.mark, axis_.x(n.t_ms), row_y(0));
        out.end();
      }
    }
    for (const Placed& p : placed) {
      const Note& n = *p.note;
      double cy = row_y(p.row);
      double x = axis_.x(n.t_ms);
      out.begin(marker_attrs(n), n.tooltip);
      if (n.mark == Mark::kRendezvous && axis_.x(n.from_ms) < x) {
        double x0 = axis_.x(n.from_ms);
        out.rect(x0, cy - 3, x - x0, 6, "wait", 2);
      }
      out.marker(n.mark, x, cy);
      std::string cls = n.mark == Mark::kFailure ? "err label"
                        : n.mark == Mark::kTimer ? "timertext label"
                                                 : "label";
      out.text(p.text_x, cy + 4, p.text, cls, p.anchor);
      out.end();
    }
    out.end();
    y_ +=
        6 + static_cast<double>(std::max<size_t>(packer.rows(), 1)) * kNoteRow;
  }

  std::string at(int64_t t_ms) const {
    return num(static_cast<double>(t_ms - tl_.t0) / 1000, 3) + " s";
  }

  // A note's group: its kind, for a script or a test to find.
  static std::string marker_attrs(const Note& n) {
    return std::string(" class=\"marker ") + mark_name(n.mark) + "\"";
  }

  std::string ran(int64_t start_ms, int64_t end_ms) const {
    return seconds_text(static_cast<double>(end_ms - start_ms) / 1000);
  }

  LaneView worker_view(const Node& node, const WorkerLane& w, bool striped) {
    std::string rank = "rank " + std::to_string(w.rank);
    LaneView v{
        .attrs = " class=\"lane\" data-host=\"" + xml(node.host) +
                 "\" data-rank=\"" + std::to_string(w.rank) + "\"",
        .name = rank,
        .detail = worker_detail(w),
        .notes = &w.notes,
        .striped = striped};
    for (const Bar& bar : w.bars) {
      std::string outcome = css_class(bar.outcome);
      std::string tip = rank + " on " + node.host + ", pid " + bar.pid +
                        ", attempt " + std::to_string(bar.attempt) + "\n";
      tip += bar.start_seen ? "started at " + at(bar.start_ms)
                            : "started before the file begins";
      tip += "\n" + outcome;
      if (bar.outcome != Outcome::kRunning) {
        tip += " at " + at(bar.end_ms);
      }
      tip += " (ran " + ran(bar.start_ms, bar.end_ms) + ")";
      v.bars.push_back(LaneBar{
          .attempt = bar.attempt,
          .start_ms = bar.start_ms,
          .end_ms = bar.end_ms,
          .outcome = bar.outcome,
          .texts = {"pid " + bar.pid, bar.pid},
          .tooltip = std::move(tip)});
    }
    return v;
  }

  LaneView summary_view(const Node& node) {
    LaneView v{
        .attrs = " class=\"summary-lane\" data-host=\"" + xml(node.host) + "\"",
        .name = plural(node.workers.size(), "worker"),
        .detail = rank_ranges(ranks_of(node)),
        .notes = &node.summary_notes,
        .striped = true};
    for (const AttemptSummary& a : node.attempts) {
      size_t workers = 0;
      for (const auto& [o, n] : a.outcomes) {
        workers += n;
      }
      std::string counts = outcome_counts(a);
      std::string tip = plural(workers, "worker") + " on " + node.host +
                        ", attempt " + std::to_string(a.attempt) + ": " +
                        counts + "\n";
      tip += a.start_seen ? "first started at " + at(a.start_ms)
                          : "started before the file begins";
      tip += a.worst == Outcome::kRunning ? "\nrunning at end of file"
                                          : "\nlast ended at " + at(a.end_ms);
      tip += " (" + ran(a.start_ms, a.end_ms) + ")";
      v.bars.push_back(LaneBar{
          .attempt = a.attempt,
          .start_ms = a.start_ms,
          .end_ms = a.end_ms,
          .outcome = a.worst,
          .texts = {counts},
          .may_shorten = true,
          .tooltip = std::move(tip)});
    }
    return v;
  }

  // A job view's node: a bar per attempt its agent recorded, with its
  // round, outcome and reason; times on the clock, since a view is live.
  LaneView record_view(const Node& node) {
    const NodeRecord& r = *node.record;
    LaneView v{
        .attrs =
            " class=\"attempts-lane\" data-host=\"" + xml(node.host) + "\"",
        .name = plural(r.ranks.size(), "worker"),
        .detail = rank_ranges(ranks_of(node)),
        .notes = &node.summary_notes,
        .striped = true};
    for (const RecordedAttempt& a : r.attempts) {
      bool running = a.outcome == Outcome::kRunning;
      std::string n = std::to_string(a.attempt);
      std::string tip = node.host + " \u00b7 attempt " + n + " \u00b7 round " +
                        std::to_string(a.round) + " \u00b7 " +
                        outcome_name(a.outcome) + "\n" + utc_text(a.start_ms) +
                        " \u2192 " + (running ? "now" : utc_text(a.end_ms)) +
                        " (" + ran(a.start_ms, a.end_ms) + ")";
      if (!a.reason.empty()) {
        tip += "\n" + a.reason;
      }
      v.bars.push_back(LaneBar{
          .attempt = a.attempt,
          .start_ms = a.start_ms,
          .end_ms = a.end_ms,
          .outcome = a.outcome,
          .texts = {"attempt " + n, "#" + n},
          .tooltip = std::move(tip)});
    }
    return v;
  }

  // A lane's name, its detail after it, shortened to the name column.
  void lane_name(Svg& out, double y, const LaneView& v) {
    double room = name_column_ - 14 - kNameX;
    std::string name = fit(v.name, room, 12, Weight::kBold);
    out.text(kNameX, y, name, "rank");
    double x = kNameX + rank_width(name) + 6;
    std::string detail = fit(v.detail, name_column_ - 14 - x, 10);
    if (detail.empty() || detail == v.detail) {
      out.text(x, y, detail, "dim");
      return;
    }
    out.begin("", v.detail);
    out.text(x, y, detail, "dim");
    out.end();
  }

  std::string bar_text(const LaneBar& bar, double width) const {
    for (const std::string& t : bar.texts) {
      if (text_width(t, 10) + 10 <= width) {
        return t;
      }
    }
    if (bar.may_shorten && !bar.texts.empty() && width > 40) {
      return fit(bar.texts.back(), width - 10, 10);
    }
    return "";
  }

  void lane(Svg& out, const LaneView& v) {
    RowPacker packer;
    auto placed = place_lane_labels(*v.notes, axis_, packer);
    double height = 28 + static_cast<double>(packer.rows()) * kTextRow;
    out.raw("<g" + v.attrs + ">\n");
    if (v.striped) {
      out.rect(0, y_, kWidth, height, "zebra");
    }
    double bar_y = y_ + 6;
    lane_name(out, bar_y + 12, v);
    for (const LaneBar& bar : v.bars) {
      // Inset a pixel so that back-to-back bars read as two.
      double x0 = axis_.x(bar.start_ms) + 1;
      double w = std::max(2.0, axis_.x(bar.end_ms) - x0 - 1);
      out.begin("", bar.tooltip);
      out.rect(
          x0,
          bar_y,
          w,
          kBarHeight,
          std::string("bar ") + css_class(bar.outcome),
          3,
          " data-attempt=\"" + std::to_string(bar.attempt) +
              "\" data-outcome=\"" + outcome_name(bar.outcome) + "\"");
      if (std::string text = bar_text(bar, w); !text.empty()) {
        out.text(x0 + 7, bar_y + 12, text, "pid");
      }
      out.end();
    }
    const std::vector<Note>& notes = *v.notes;
    for (const Note& n : notes) {
      // A timer or hang that killed the worker: its mark beside the
      // failure's cross.
      double x = axis_.x(n.t_ms);
      bool beside_failure =
          n.mark != Mark::kFailure &&
          std::any_of(notes.begin(), notes.end(), [&](const Note& f) {
            return f.mark == Mark::kFailure &&
                   std::abs(axis_.x(f.t_ms) - x) < 12;
          });
      out.begin(marker_attrs(n), n.tooltip);
      out.marker(n.mark, beside_failure ? x - 14 : x, bar_y + kBarHeight / 2);
      out.end();
    }
    for (const Placed& p : placed) {
      label(
          out,
          p,
          bar_y + kBarHeight + 12 + kTextRow * static_cast<double>(p.row),
          p.note->mark == Mark::kFailure ? "err label" : "timertext label");
    }
    out.raw("</g>\n");
    y_ += height;
  }

  void time_axis() {
    double step = axis_.step_units();
    int decimals =
        std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
    for (int i = 0; step * i * axis_.unit_ms <= axis_.span_ms + 1e-6; ++i) {
      double v = step * i;
      double x = axis_.left +
                 v * axis_.unit_ms / axis_.span_ms * (axis_.right - axis_.left);
      grid_.line(x, lanes_top_, x, lanes_bottom_, "grid spans");
      bottom_.line(x, lanes_bottom_, x, lanes_bottom_ + 5, "axis");
      bottom_.text(x, lanes_bottom_ + 18, num(v, decimals), "", "middle");
    }
    bottom_.line(axis_.left, lanes_bottom_, axis_.right, lanes_bottom_, "axis");
    bottom_.text(
        (axis_.left + axis_.right) / 2,
        lanes_bottom_ + 36,
        axis_.unit + " since " +
            (tl_.live ? "the job's first start" : "the first event") + " (" +
            utc_text(tl_.t0) + ")",
        "sub",
        "middle");
  }

  // Dashed lines at restarts, labelled with the attempt that follows.
  void boundaries() {
    RowPacker labels;
    auto label = [&](double x, const std::string& text) {
      double w = text_width(text, kFont, Weight::kBold);
      bool left = x + 4 + w > kRightEdge;
      double x0 = left ? x - 4 - w : x + 4;
      if (auto row = labels.place(x0, x0 + w); row && *row == 0) {
        marks_.text(
            left ? x - 4 : x + 4,
            attempts_y_,
            text,
            "battempt",
            left ? "end" : "start");
      }
    };
    label(axis_.left, "attempt 0");
    double last_x = -100;
    std::string last_label;
    for (const Boundary& b : tl_.boundaries) {
      double x = axis_.x(b.t_ms);
      if (b.label == last_label && x - last_x < 4) {
        continue;  // the same restart seen by another node's agent
      }
      last_x = x;
      last_label = b.label;
      marks_.line(x, attempts_y_ - 12, x, lanes_bottom_, "boundary spans");
      label(x, b.label);
    }
  }

  const Timeline& tl_;
  std::vector<Node> nodes_;
  RenderOptions options_;
  double name_column_;
  Axis axis_;
  std::string title_;
  double y_ = 0;
  double attempts_y_ = 0;
  double lanes_top_ = 0;
  double lanes_bottom_ = 0;
  Svg top_;
  Svg grid_;
  Svg lanes_;
  Svg bottom_;
  Svg marks_;
};

}  // namespace

std::string render_svg(
    const Timeline& timeline,
    const std::string& title,
    const RenderOptions& options) {
  return Renderer(timeline, title, options).svg();
}

}  // namespace tide::timeline
