#include "timeline/svg.h"

#include "timeline/text.h"

namespace tide::timeline {

void Svg::text(
    double x,
    double y,
    const std::string& content,
    const std::string& cls,
    const char* anchor) {
  out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"";
  if (!cls.empty()) {
    out_ += " class=\"" + cls + "\"";
  }
  if (std::string(anchor) != "start") {
    out_ += std::string(" text-anchor=\"") + anchor + "\"";
  }
  out_ += ">" + xml(content) + "</text>\n";
}

void Svg::line(
    double x1, double y1, double x2, double y2, const std::string& cls) {
  out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" +
          num(x2) + "\" y2=\"" + num(y2) + "\" class=\"" + cls + "\"/>\n";
}

void Svg::rect(
    double x,
    double y,
    double w,
    double h,
    const std::string& cls,
    double radius,
    const std::string& attrs) {
  out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) +
          "\" height=\"" + num(h) + "\"";
  if (radius > 0) {
    out_ += " rx=\"" + num(radius) + "\"";
  }
  out_ += " class=\"" + cls + "\"" + attrs + "/>\n";
}

void Svg::begin(const std::string& attrs, const std::string& title) {
  out_ += "<g" + attrs + "><title>" + xml(title, true) + "</title>\n";
}

void Svg::marker(Mark m, double x, double y) {
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
    case Mark::kHang:
      // An hourglass: time that stopped passing.
      raw("<polygon points=\"" + pt(-5, -6) + pt(5, -6) + pt(-5, 6) + pt(5, 6) +
          "\" class=\"hang\"/>\n");
      break;
  }
}

}  // namespace tide::timeline
