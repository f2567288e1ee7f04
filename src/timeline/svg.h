#pragma once

#include <string>

#include "timeline/model.h"

// SVG text accumulated element by element, numbers written with one decimal
// and text escaped; plus the marker drawn for each kind of note.
namespace tide::timeline {

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
      const char* anchor = "start");
  void line(double x1, double y1, double x2, double y2, const std::string& cls);
  void rect(
      double x,
      double y,
      double w,
      double h,
      const std::string& cls,
      double radius = 0,
      const std::string& attrs = "");  // more attributes, after a blank
  // Opens a group whose tooltip is title; attrs starts with a blank.
  void begin(const std::string& attrs, const std::string& title);
  void end() {
    out_ += "</g>\n";
  }
  // The marker of a note, centred on (x, y).
  void marker(Mark m, double x, double y);
  const std::string& str() const {
    return out_;
  }

 private:
  std::string out_;
};

}  // namespace tide::timeline
