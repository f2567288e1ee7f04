#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "timeline/model.h"

// Where things go in the picture: its geometry, the time axis, and labels
// laid out in rows so that none overlaps another and none runs off the
// picture; a label with no room for all of it is shortened to the room it
// has, with an ellipsis (its note's tooltip keeps it whole).
namespace tide::timeline {

inline constexpr double kWidth = 1200;
inline constexpr double kPlotRight = 1150;
inline constexpr double kRightEdge = kWidth - 8;  // text ends before this
inline constexpr double kFont = 11;               // labels
inline constexpr size_t kMaxRows = 4;             // label rows a lane grows to

// Time axis: milliseconds to x, and round tick steps in a readable unit.
struct Axis {
  int64_t t0 = 0;
  double span_ms = 1;
  double unit_ms = 1000;
  std::string unit = "seconds";
  double left = 200;  // x of t0
  double right = kPlotRight;

  double x(int64_t t) const;
  double step_units() const;
};

// The axis of tl, plotted between x = left and kPlotRight.
Axis make_axis(const Timeline& tl, double left);

// Assigns labels to rows so that none overlaps another in its row.
class RowPacker {
 public:
  // The first row where [x0, x1] is free, taken; nullopt past kMaxRows.
  std::optional<size_t> place(double x0, double x1);
  // The row with the most room right of x (up to limit) where [x0, x] is
  // free, and that room; nullopt when no row has any.
  std::optional<std::pair<size_t, double>> widest(
      double x0, double x, double limit) const;
  void take(size_t row, double x0, double x1);
  // Rows holding a label.
  size_t rows() const;

 private:
  bool free(size_t row, double x0, double x1) const;

  std::vector<std::vector<std::pair<double, double>>> rows_;
};

// A label laid out in a lane: its row, where its text starts, its anchor,
// and its text (shortened when it had no room).
struct Placed {
  const Note* note;
  size_t row;
  double text_x;
  const char* anchor;
  std::string text;
};

// Lays out an agent lane's notes as marker plus label; labels go right of
// the marker, or left of it when they would run off the picture.
std::vector<Placed> place_notes(
    const std::vector<Note>& notes, const Axis& axis, RowPacker& packer);

// Lays out the labels under a worker's bars: a failure's from the start of
// its bar, any other from its marker; either ends at its marker instead when
// it would run off the picture.
std::vector<Placed> place_lane_labels(
    const std::vector<Note>& notes, const Axis& axis, RowPacker& packer);

}  // namespace tide::timeline
