#include "timeline/text.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tide::timeline {

using nlohmann::json;

// Escapes text for XML content and attribute values. Control characters XML
// 1.0 forbids become spaces, as do newlines unless keep_newlines.
std::string xml(const std::string& s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '\n':
        out += keep_newlines ? "\n" : " ";
        break;
      default:
        out += static_cast<unsigned char>(c) < 0x20 && c != '\t' ? ' ' : c;
    }
  }
  return out;
}

size_t code_points(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

// At most max_chars code points, ending in an ellipsis when cut; never splits
// a UTF-8 sequence.
std::string truncate(const std::string& s, size_t max_chars) {
  if (code_points(s) <= max_chars) {
    return s;
  }
  size_t kept = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 &&
        ++kept == max_chars) {
      return s.substr(0, i) + "\u2026";
    }
  }
  return s;
}

// Whitespace runs (newlines included) become one space; ends trimmed.
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if (!space) {
      out += c;
    } else if (!out.empty() && out.back() != ' ') {
      out += ' ';
    }
  }
  if (!out.empty() && out.back() == ' ') {
    out.pop_back();
  }
  return out;
}

std::string num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string seconds_text(double s) {
  if (s < 60) {
    return num(s, s < 10 ? 2 : 1) + " s";
  }
  if (s < 3600) {
    return num(std::floor(s / 60), 0) + " min " + num(std::fmod(s, 60), 0) +
           " s";
  }
  return num(std::floor(s / 3600), 0) + " h " +
         num(std::floor(std::fmod(s, 3600) / 60), 0) + " min";
}

std::string utc_text(int64_t ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &t);
  char out[96];
  std::snprintf(
      out, sizeof out, "%s.%03d UTC", buf, static_cast<int>(ms % 1000));
  return out;
}

// The short form of a worker's raw_error: the message of torch's error file
// JSON ({"message": "..."} or {"message": {"message": "...", "extraInfo":
// ...}}), else the raw text; for a Python traceback its last line.
std::string short_error(const std::string& raw) {
  std::string msg = raw;
  json j = json::parse(raw, nullptr, false);
  if (!j.is_discarded() && j.is_string()) {
    msg = j.get<std::string>();
  } else if (!j.is_discarded() && j.is_object()) {
    auto m = j.find("message");
    if (m != j.end() && m->is_string()) {
      msg = m->get<std::string>();
    } else if (
        m != j.end() && m->is_object() && m->contains("message") &&
        (*m)["message"].is_string()) {
      msg = (*m)["message"].get<std::string>();
    }
  }
  // tide's hint after an exit code adds nothing to a picture.
  if (auto hint = msg.find("; to see the worker's error here");
      hint != std::string::npos) {
    msg.erase(hint);
  }
  if (msg.rfind("Traceback", 0) == 0) {
    std::string last;
    std::istringstream lines(msg);
    for (std::string line; std::getline(lines, line);) {
      if (!one_line(line).empty()) {
        last = line;
      }
    }
    msg = last;
  }
  msg = one_line(msg);
  return msg.empty() || msg == "<NONE>" ? "failed (no error message)" : msg;
}

}  // namespace tide::timeline
