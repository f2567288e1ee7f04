#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// Text for the picture: escaping for SVG, cutting to a number of characters,
// numbers, durations and times as people read them, a worker's error in one
// line. How wide text is drawn: font.h.
namespace tide::timeline {

// Escapes text for XML content and attribute values. Control characters XML
// 1.0 forbids become spaces, as do newlines unless keep_newlines.
std::string xml(const std::string& s, bool keep_newlines = false);
// UTF-8 code points in s.
size_t code_points(const std::string& s);
// At most max_chars code points, ending in an ellipsis when cut; never splits
// a UTF-8 sequence.
std::string truncate(const std::string& s, size_t max_chars);
// Whitespace runs (newlines included) become one space; ends trimmed.
std::string one_line(const std::string& s);
std::string num(double v, int decimals = 1);
std::string seconds_text(double s);
std::string utc_text(int64_t ms);
// The short form of a worker's raw_error: the message of torch's error file
// JSON ({"message": "..."} or {"message": {"message": "...", "extraInfo":
// ...}}), else the raw text; for a Python traceback its last line; in one
// line but whole, since the picture shortens it to the room it has.
std::string short_error(const std::string& raw);

}  // namespace tide::timeline
