#include "timeline/layout.h"

#include <algorithm>
#include <cmath>

#include "timeline/font.h"

namespace tide::timeline {

double Axis::x(int64_t t) const {
  return left +
         static_cast<double>(std::max(t, t0) - t0) / span_ms * (right - left);
}

double Axis::step_units() const {
  double raw = span_ms / unit_ms / 10;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * mag >= raw) {
      return m * mag;
    }
  }
  return 10 * mag;
}

Axis make_axis(const Timeline& tl, double left) {
  Axis a;
  a.t0 = tl.t0;
  a.left = left;
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

namespace {

constexpr double kGap = 6;  // between labels in a row
// A label cut shorter than this says nothing; its marker's tooltip does.
constexpr double kMinLabel = 3 * kFont;

}  // namespace

bool RowPacker::free(size_t row, double x0, double x1) const {
  return row >= rows_.size() ||
         std::none_of(rows_[row].begin(), rows_[row].end(), [&](const auto& s) {
           return x0 < s.second + kGap && s.first < x1 + kGap;
         });
}

std::optional<size_t> RowPacker::place(double x0, double x1) {
  for (size_t row = 0; row < kMaxRows; ++row) {
    if (free(row, x0, x1)) {
      take(row, x0, x1);
      return row;
    }
  }
  return std::nullopt;
}

std::optional<std::pair<size_t, double>> RowPacker::widest(
    double x0, double x, double limit) const {
  std::optional<std::pair<size_t, double>> best;
  for (size_t row = 0; row < kMaxRows; ++row) {
    if (!free(row, x0, x)) {
      continue;
    }
    double end = limit;
    if (row < rows_.size()) {
      for (const auto& [s0, s1] : rows_[row]) {
        if (s0 >= x) {
          end = std::min(end, s0 - kGap);
        }
      }
    }
    if (end > x && (!best || end - x > best->second)) {
      best = std::pair{row, end - x};
    }
  }
  return best;
}

void RowPacker::take(size_t row, double x0, double x1) {
  if (rows_.size() <= row) {
    rows_.resize(row + 1);
  }
  rows_[row].emplace_back(x0, x1);
}

size_t RowPacker::rows() const {
  size_t n = 0;
  for (size_t i = 0; i < rows_.size(); ++i) {
    n = rows_[i].empty() ? n : i + 1;
  }
  return n;
}

namespace {

// A label's two ways to go: its text from `start` rightwards, its marker
// taking [lead, start) before it; or its text ending at `end`, its marker
// taking (end, tail] after it.
struct Slot {
  double lead;
  double start;
  double end;
  double tail;
};

// Whole where a row has room for it: rightwards when it ends before the
// picture's edge, else leftwards when it starts after left_limit. Otherwise
// shortened to the most room any row has right of start.
std::optional<Placed> place_label(
    const Note& n, const Slot& s, double left_limit, RowPacker& packer) {
  double w = text_width(n.label, kFont);
  Placed p{
      .note = &n,
      .row = 0,
      .text_x = s.start,
      .anchor = "start",
      .text = n.label};
  if (s.start + w <= kRightEdge) {
    if (auto row = packer.place(s.lead, s.start + w)) {
      p.row = *row;
      return p;
    }
  } else if (s.end - w >= left_limit) {
    if (auto row = packer.place(s.end - w, s.tail)) {
      p.row = *row;
      p.text_x = s.end;
      p.anchor = "end";
      return p;
    }
  }
  auto widest = packer.widest(s.lead, s.start, kRightEdge);
  if (!widest || widest->second < kMinLabel) {
    return std::nullopt;
  }
  p.text = fit(n.label, widest->second, kFont);
  if (p.text.empty()) {
    return std::nullopt;
  }
  p.row = widest->first;
  packer.take(p.row, s.lead, s.start + text_width(p.text, kFont));
  return p;
}

}  // namespace

std::vector<Placed> place_notes(
    const std::vector<Note>& notes, const Axis& axis, RowPacker& packer) {
  std::vector<Placed> placed;
  for (const Note& n : notes) {
    double x = axis.x(n.t_ms);
    double from =
        n.mark == Mark::kRendezvous ? std::min(axis.x(n.from_ms), x) : x;
    Slot slot{
        .lead = from - 7, .start = x + 10, .end = from - 10, .tail = x + 7};
    if (auto p = place_label(n, slot, axis.left, packer)) {
      placed.push_back(std::move(*p));
    }
  }
  return placed;
}

std::vector<Placed> place_lane_labels(
    const std::vector<Note>& notes, const Axis& axis, RowPacker& packer) {
  std::vector<Placed> placed;
  for (const Note& n : notes) {
    double x =
        n.mark == Mark::kFailure ? axis.x(n.from_ms) + 2 : axis.x(n.t_ms) - 6;
    double end = axis.x(n.t_ms) + 6;
    Slot slot{.lead = x, .start = x, .end = end, .tail = end};
    if (auto p = place_label(n, slot, axis.left, packer)) {
      placed.push_back(std::move(*p));
    }
  }
  return placed;
}

}  // namespace tide::timeline
