#include "tide-timeline/render.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "tide-timeline/text.h"

namespace tide::timeline {
namespace {

constexpr double kWidth = 1200;
constexpr double kPlotLeft = 200;
constexpr double kPlotRight = 1150;
constexpr double kFont = 11;
constexpr double kNoteRow = 17;  // agent lane rows
constexpr double kTextRow = 14;  // text rows under a worker's bars
constexpr double kBarHeight = 16;
constexpr size_t kMaxRows = 4;

constexpr const char* kStyle = R"(
  text { font-family: 'DejaVu Sans', Helvetica, Arial, sans-serif; font-size: 11px; fill: #24292f; }
  .title { font-size: 18px; font-weight: bold; }
  .sub { font-size: 12px; fill: #57606a; }
  .dim { font-size: 10px; fill: #6e7781; }
  .host { font-size: 12px; font-weight: bold; }
  .rank { font-size: 12px; font-weight: bold; }
  .agent { font-style: italic; fill: #57606a; }
  .zebra { fill: #f6f8fa; }
  .grid { stroke: #e1e4e8; stroke-width: 1; }
  .axis { stroke: #57606a; stroke-width: 1; }
  .boundary { stroke: #57606a; stroke-width: 1.2; stroke-dasharray: 6 4; }
  .battempt { font-size: 11px; font-weight: bold; fill: #57606a; }
  .succeeded { fill: #2da44e; }
  .failed { fill: #cf222e; }
  .terminated { fill: #8c959f; }
  .running { fill: #0969da; }
  .pid { font-size: 10px; fill: #ffffff; }
  .err { fill: #cf222e; }
  .rdzv { fill: #8250df; }
  .wait { fill: #8250df; opacity: 0.3; }
  .restart { fill: #e16f24; }
  .timer { fill: #ffffff; stroke: #9a6700; stroke-width: 2; }
  .hand { stroke: #9a6700; stroke-width: 1.5; }
  .timertext { fill: #9a6700; }
  .cross { stroke: #cf222e; stroke-width: 2.5; stroke-linecap: round; }
  .halo { stroke: #ffffff; stroke-width: 5.5; stroke-linecap: round; }
  .pending { fill: none; stroke: #8250df; stroke-width: 2; }
  .label { paint-order: stroke; stroke: #ffffff; stroke-width: 3px; stroke-linejoin: round; }
)";

// SVG text accumulated element by element.
class Svg {
 public:
  void raw(const std::string& s) {
    out_ += s;
  }
  void text(
      double x,
      double y,
      const std::string& content,
      const std::string& cls = "",
      const char* anchor = "start") {
    out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"";
    if (!cls.empty()) {
      out_ += " class=\"" + cls + "\"";
    }
    if (std::string(anchor) != "start") {
      out_ += std::string(" text-anchor=\"") + anchor + "\"";
    }
    out_ += ">" + xml(content) + "</text>\n";
  }
  void line(
      double x1, double y1, double x2, double y2, const std::string& cls) {
    out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" +
            num(x2) + "\" y2=\"" + num(y2) + "\" class=\"" + cls + "\"/>\n";
  }
  void rect(
      double x,
      double y,
      double w,
      double h,
      const std::string& cls,
      double radius = 0) {
    out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" +
            num(w) + "\" height=\"" + num(h) + "\"";
    if (radius > 0) {
      out_ += " rx=\"" + num(radius) + "\"";
    }
    out_ += " class=\"" + cls + "\"/>\n";
  }
  // Opens a group whose tooltip is title.
  void begin(const std::string& attrs, const std::string& title) {
    out_ += "<g" + attrs + "><title>" + xml(title, true) + "</title>\n";
  }
  void end() {
    out_ += "</g>\n";
  }
  // The marker of a note, centred on (x, y).
  void marker(Mark m, double x, double y) {
    auto pt = [&](double dx, double dy) {
      return num(x + dx) + "," + num(y + dy) + " ";
    };
    switch (m) {
      case Mark::kRendezvous:
        raw("<polygon points=\"" + pt(0, -6) + pt(6, 0) + pt(0, 6) + pt(-6, 0) +
            "\" class=\"rdzv\"/>\n");
        break;
      case Mark::kRestart:
        raw("<polygon points=\"" + pt(0, -6) + pt(6, 5) + pt(-6, 5) +
            "\" class=\"restart\"/>\n");
        break;
      case Mark::kTimer:
        raw("<circle cx=\"" + num(x) + "\" cy=\"" + num(y) +
            "\" r=\"6\" class=\"timer\"/>\n");
        line(x, y, x, y - 4, "hand");
        line(x, y, x + 3, y, "hand");
        break;
      case Mark::kFailure:
        for (const char* cls : {"halo", "cross"}) {
          line(x - 4.5, y - 4.5, x + 4.5, y + 4.5, cls);
          line(x - 4.5, y + 4.5, x + 4.5, y - 4.5, cls);
        }
        break;
      case Mark::kRdzvPending:
        raw("<polygon points=\"" + pt(0, -6) + pt(6, 0) + pt(0, 6) + pt(-6, 0) +
            "\" class=\"pending\"/>\n");
        break;
    }
  }
  const std::string& str() const {
    return out_;
  }

 private:
  std::string out_;
};

// Assigns labels to rows so that none overlaps another in its row.
class RowPacker {
 public:
  // The first row where [x0, x1] is free, or nullopt past kMaxRows.
  std::optional<size_t> place(double x0, double x1) {
    for (size_t row = 0; row < kMaxRows; ++row) {
      if (row == rows_.size()) {
        rows_.emplace_back();
      }
      bool free = std::none_of(
          rows_[row].begin(), rows_[row].end(), [&](const auto& span) {
            return x0 < span.second + 6 && span.first < x1 + 6;
          });
      if (free) {
        rows_[row].emplace_back(x0, x1);
        return row;
      }
    }
    return std::nullopt;
  }
  size_t rows() const {
    size_t n = 0;
    for (size_t i = 0; i < rows_.size(); ++i) {
      n = rows_[i].empty() ? n : i + 1;
    }
    return n;
  }

 private:
  std::vector<std::vector<std::pair<double, double>>> rows_;
};

// A label laid out in a lane: its row, where its text starts, its anchor.
struct Placed {
  const Note* note;
  size_t row;
  double text_x;
  const char* anchor;
  std::string text;
};

// Time axis: milliseconds to x, and round tick steps in a readable unit.
struct Axis {
  int64_t t0 = 0;
  double span_ms = 1;
  double unit_ms = 1000;
  std::string unit = "seconds";

  double x(int64_t t) const {
    return kPlotLeft + static_cast<double>(std::max(t, t0) - t0) / span_ms *
                           (kPlotRight - kPlotLeft);
  }
  double step_units() const {
    double raw = span_ms / unit_ms / 10;
    double mag = std::pow(10, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * mag >= raw) {
        return m * mag;
      }
    }
    return 10 * mag;
  }
};

Axis make_axis(const Timeline& tl) {
  Axis a;
  a.t0 = tl.t0;
  a.span_ms = std::max<double>(static_cast<double>(tl.t1 - tl.t0), 100);
  if (a.span_ms > 5 * 3600e3) {
    a.unit_ms = 3600e3;
    a.unit = "hours";
  } else if (a.span_ms > 300e3) {
    a.unit_ms = 60e3;
    a.unit = "minutes";
  }
  return a;
}

// Lays out notes as marker plus label; labels go right of the marker, or left
// when they would run off the picture.
std::vector<Placed> place_notes(
    const std::vector<Note>& notes, const Axis& axis, RowPacker& packer) {
  std::vector<Placed> placed;
  for (const Note& n : notes) {
    double x = axis.x(n.t_ms);
    double w = text_width(n.label, kFont);
    double from =
        n.mark == Mark::kRendezvous ? std::min(axis.x(n.from_ms), x) : x;
    Placed p{
        .note = &n,
        .row = 0,
        .text_x = x + 10,
        .anchor = "start",
        .text = n.label};
    double x0 = from - 7;
    double x1 = x + 10 + w;
    if (x1 > kWidth - 8) {
      p.text_x = from - 10;
      p.anchor = "end";
      x0 = from - 10 - w;
      x1 = x + 7;
    }
    if (auto row = packer.place(x0, x1)) {
      p.row = *row;
      placed.push_back(std::move(p));
    }
  }
  return placed;
}

// Lays out the labels under a worker's bars: a failure's from the start of
// its bar, a timer's from its marker; either ends at its marker instead when
// it would run off the picture.
std::vector<Placed> place_lane_labels(
    const std::vector<Note>& notes, const Axis& axis, RowPacker& packer) {
  std::vector<Placed> placed;
  for (const Note& n : notes) {
    double x =
        n.mark == Mark::kFailure ? axis.x(n.from_ms) + 2 : axis.x(n.t_ms) - 6;
    double end = axis.x(n.t_ms) + 6;
    Placed p{
        .note = &n, .row = 0, .text_x = x, .anchor = "start", .text = n.label};
    double w = text_width(p.text, kFont);
    if (x + w > kWidth - 10) {
      if (end - w >= kPlotLeft) {
        p.text_x = end;
        p.anchor = "end";
        x = end - w;
      } else {
        p.text = fit(p.text, kWidth - 10 - x, kFont);
        w = text_width(p.text, kFont);
      }
    }
    if (auto row = packer.place(x, x + w)) {
      p.row = *row;
      placed.push_back(std::move(p));
    }
  }
  return placed;
}

std::string outcome_text(const Timeline& tl) {
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

// Draws a Timeline top to bottom: heading, legend, per host an agent lane
// and a lane per worker, then the time axis. Layers, bottom up: top_ (heading
// and legend), stripes_, grid_ (which needs the lanes' height), lanes_,
// marks_ (attempt boundaries).
class Renderer {
 public:
  Renderer(const Timeline& tl, std::string title)
      : tl_(tl), axis_(make_axis(tl)), title_(std::move(title)) {}

  std::string svg() {
    heading();
    legend();
    y_ += 30;
    attempts_y_ = y_;
    y_ += 8;
    lanes_top_ = y_;
    for (const std::string& host : hosts()) {
      host_section(host);
    }
    lanes_bottom_ = y_;
    time_axis();
    boundaries();
    std::string w = num(kWidth, 0);
    std::string h = num(lanes_bottom_ + 52, 0);
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w +
           "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h +
           "\">\n<title>" + xml(title_) + "</title>\n<style>" + kStyle +
           "</style>\n<rect width=\"" + w + "\" height=\"" + h +
           "\" fill=\"#ffffff\"/>\n" + top_.str() + stripes_.str() +
           grid_.str() + lanes_.str() + marks_.str() + "</svg>\n";
  }

 private:
  std::set<std::string> worker_hosts() const {
    std::set<std::string> hosts;
    for (const auto& [key, lane] : tl_.workers) {
      hosts.insert(key.first);
    }
    return hosts;
  }

  // Hosts by group rank, then name.
  std::vector<std::string> hosts() const {
    std::set<std::string> all = worker_hosts();
    for (const auto& [host, notes] : tl_.agent_notes) {
      all.insert(host);
    }
    std::vector<std::string> order(all.begin(), all.end());
    auto rank = [&](const std::string& h) {
      auto it = tl_.host_order.find(h);
      return it == tl_.host_order.end() ? std::numeric_limits<int64_t>::max()
                                        : it->second;
    };
    std::stable_sort(
        order.begin(), order.end(), [&](const auto& a, const auto& b) {
          return rank(a) < rank(b);
        });
    return order;
  }

  void heading() {
    y_ = 30;
    top_.text(20, y_, title_, "title");
    const char* dot = " \u00b7 ";
    std::string sub = tl_.run_id.empty() ? "" : "run " + tl_.run_id + dot;
    sub += plural(tl_.workers.size(), "worker") + " on " +
           plural(worker_hosts().size(), "host") + dot +
           plural(static_cast<size_t>(tl_.attempts), "attempt") + dot +
           seconds_text(static_cast<double>(tl_.t1 - tl_.t0) / 1000) + dot +
           outcome_text(tl_);
    top_.text(20, y_ += 20, sub, "sub");
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
          std::pair{Outcome::kRunning, "running at end of file"}}) {
      item(label, [&](double cx, double cy) {
        top_.rect(cx - 8, cy - 6, 16, 12, css_class(o), 2);
      });
    }
    for (auto [m, label] :
         {std::pair{Mark::kRendezvous, "rendezvous (band: wait)"},
          std::pair{Mark::kRestart, "restart"},
          std::pair{Mark::kTimer, "timer expired"},
          std::pair{Mark::kFailure, "failure"}}) {
      item(label, [&](double cx, double cy) { top_.marker(m, cx, cy); });
    }
    item("attempt boundary", [&](double cx, double cy) {
      top_.line(cx, cy - 8, cx, cy + 8, "boundary");
    });
  }

  void host_section(const std::string& host) {
    lanes_.line(12, y_, kWidth - 12, y_, "grid");
    std::string header = host;
    if (auto it = tl_.host_order.find(host); it != tl_.host_order.end()) {
      header += "  \u00b7  group rank " + std::to_string(it->second);
    }
    lanes_.text(14, y_ + 16, header, "host");
    y_ += 24;
    if (auto it = tl_.agent_notes.find(host);
        it != tl_.agent_notes.end() && !it->second.empty()) {
      agent_lane(host, it->second);
    }
    for (const auto& [key, lane] : tl_.workers) {
      if (key.first == host) {
        worker_lane(host, lane);
      }
    }
  }

  void agent_lane(const std::string& host, const std::vector<Note>& notes) {
    RowPacker packer;
    auto placed = place_notes(notes, axis_, packer);
    lanes_.begin(
        " class=\"agent-lane\" data-host=\"" + xml(host) + "\"",
        "agent on " + host);
    lanes_.text(28, y_ + 15, "agent", "agent");
    for (const Placed& p : placed) {
      const Note& n = *p.note;
      double cy = y_ + 3 + kNoteRow * (static_cast<double>(p.row) + 0.5);
      double x = axis_.x(n.t_ms);
      lanes_.begin("", n.tooltip);
      if (n.mark == Mark::kRendezvous && axis_.x(n.from_ms) < x) {
        double x0 = axis_.x(n.from_ms);
        lanes_.rect(x0, cy - 3, x - x0, 6, "wait", 2);
      }
      lanes_.marker(n.mark, x, cy);
      std::string cls = n.mark == Mark::kFailure ? "err label"
                        : n.mark == Mark::kTimer ? "timertext label"
                                                 : "label";
      lanes_.text(p.text_x, cy + 4, p.text, cls, p.anchor);
      lanes_.end();
    }
    lanes_.end();
    y_ +=
        6 + static_cast<double>(std::max<size_t>(packer.rows(), 1)) * kNoteRow;
  }

  std::string at(int64_t t_ms) const {
    return num(static_cast<double>(t_ms - tl_.t0) / 1000, 3) + " s";
  }

  void worker_lane(const std::string& host, const WorkerLane& lane) {
    RowPacker packer;
    auto placed = place_lane_labels(lane.notes, axis_, packer);
    double height = 28 + static_cast<double>(packer.rows()) * kTextRow;
    if (zebra_++ % 2 == 0) {
      stripes_.rect(0, y_, kWidth, height, "zebra");
    }
    std::string rank = "rank " + std::to_string(lane.rank);
    lanes_.raw(
        "<g class=\"lane\" data-host=\"" + xml(host) + "\" data-rank=\"" +
        std::to_string(lane.rank) + "\">\n");
    double bar_y = y_ + 6;
    lanes_.text(28, bar_y + 12, rank, "rank");
    std::string detail =
        lane.local_rank ? "local " + std::to_string(*lane.local_rank) : "";
    if (tl_.roles.size() > 1 && !lane.role.empty()) {
      detail += (detail.empty() ? "" : " \u00b7 ") + lane.role;
    }
    lanes_.text(34 + text_width(rank, 12), bar_y + 12, detail, "dim");
    for (const Bar& bar : lane.bars) {
      // Inset a pixel so that back-to-back workers read as two bars.
      double x0 = axis_.x(bar.start_ms) + 1;
      double w = std::max(2.0, axis_.x(bar.end_ms) - x0 - 1);
      std::string outcome = css_class(bar.outcome);
      std::string tip = rank + " on " + host + ", pid " + bar.pid +
                        ", attempt " + std::to_string(bar.attempt) + "\n";
      tip += bar.start_seen ? "started at " + at(bar.start_ms)
                            : "started before the file begins";
      tip += "\n" + outcome;
      if (bar.outcome != Outcome::kRunning) {
        tip += " at " + at(bar.end_ms);
      }
      tip +=
          " (ran " +
          seconds_text(static_cast<double>(bar.end_ms - bar.start_ms) / 1000) +
          ")";
      lanes_.begin("", tip);
      lanes_.rect(x0, bar_y, w, kBarHeight, "bar " + outcome, 3);
      for (const std::string& pid : {"pid " + bar.pid, bar.pid}) {
        if (text_width(pid, 10) + 10 <= w) {
          lanes_.text(x0 + 7, bar_y + 12, pid, "pid");
          break;
        }
      }
      lanes_.end();
    }
    for (const Note& n : lane.notes) {
      // A timer that killed the worker: its clock beside the failure's cross.
      double x = axis_.x(n.t_ms);
      bool beside_failure =
          n.mark == Mark::kTimer &&
          std::any_of(lane.notes.begin(), lane.notes.end(), [&](const Note& f) {
            return f.mark == Mark::kFailure &&
                   std::abs(axis_.x(f.t_ms) - x) < 12;
          });
      lanes_.begin("", n.tooltip);
      lanes_.marker(
          n.mark, beside_failure ? x - 14 : x, bar_y + kBarHeight / 2);
      lanes_.end();
    }
    for (const Placed& p : placed) {
      lanes_.begin("", p.note->tooltip);
      lanes_.text(
          p.text_x,
          bar_y + kBarHeight + 12 + kTextRow * static_cast<double>(p.row),
          p.text,
          p.note->mark == Mark::kFailure ? "err label" : "timertext label",
          p.anchor);
      lanes_.end();
    }
    lanes_.raw("</g>\n");
    y_ += height;
  }

  void time_axis() {
    double step = axis_.step_units();
    int decimals =
        std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
    for (int i = 0; step * i * axis_.unit_ms <= axis_.span_ms + 1e-6; ++i) {
      double v = step * i;
      double x = kPlotLeft +
                 v * axis_.unit_ms / axis_.span_ms * (kPlotRight - kPlotLeft);
      grid_.line(x, lanes_top_, x, lanes_bottom_, "grid");
      grid_.line(x, lanes_bottom_, x, lanes_bottom_ + 5, "axis");
      grid_.text(x, lanes_bottom_ + 18, num(v, decimals), "", "middle");
    }
    grid_.line(kPlotLeft, lanes_bottom_, kPlotRight, lanes_bottom_, "axis");
    grid_.text(
        (kPlotLeft + kPlotRight) / 2,
        lanes_bottom_ + 36,
        axis_.unit + " since the first event (" + utc_text(tl_.t0) + ")",
        "sub",
        "middle");
  }

  // Dashed lines at restarts, labelled with the attempt that follows.
  void boundaries() {
    RowPacker labels;
    auto label = [&](double x, const std::string& text) {
      double w = text_width(text, kFont);
      bool left = x + 4 + w > kWidth - 8;
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
    label(kPlotLeft, "attempt 0");
    double last_x = -100;
    std::string last_label;
    for (const Boundary& b : tl_.boundaries) {
      double x = axis_.x(b.t_ms);
      if (b.label == last_label && x - last_x < 4) {
        continue;  // the same restart seen by another node's agent
      }
      last_x = x;
      last_label = b.label;
      marks_.line(x, attempts_y_ - 12, x, lanes_bottom_, "boundary");
      label(x, b.label);
    }
  }

  const Timeline& tl_;
  Axis axis_;
  std::string title_;
  double y_ = 0;
  double attempts_y_ = 0;
  double lanes_top_ = 0;
  double lanes_bottom_ = 0;
  size_t zebra_ = 0;
  Svg top_;
  Svg stripes_;
  Svg grid_;
  Svg lanes_;
  Svg marks_;
};

}  // namespace

std::string render_svg(const Timeline& timeline, const std::string& title) {
  return Renderer(timeline, title).svg();
}

}  // namespace tide::timeline
