#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

// Reading an events file (tiderun --events jsonl:PATH): its lines as
// records, one run's of them, and warnings about the lines skipped.
namespace tide::timeline {

using nlohmann::json;

// Input the timeline cannot be drawn from (tide-timeline ends with exit
// code 1 and this message).
struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A field as text (numbers and booleans as JSON writes them), or nullopt.
std::optional<std::string> str(const json& j, const char* key);
// A field as an integer (a number, or a string holding one), or nullopt.
std::optional<int64_t> integer(const json& j, const char* key);

// One event line, the timeline's unit of input.
struct Record {
  int64_t t_ms = 0;
  std::string name;
  bool rdzv = false;  // a rendezvous event ("event_type": "rdzv")
  json body;          // an agent event's metadata, or the rdzv event itself
  size_t line = 0;
};

struct Input {
  std::vector<Record> records;
  size_t lines = 0;
  size_t malformed = 0;
};

// Warns on stderr about skipped lines, the first few in full.
class Warnings {
 public:
  explicit Warnings(std::string path) : path_(std::move(path)) {}
  ~Warnings() {
    if (count_ > kShown) {
      std::fprintf(
          stderr,
          "tide-timeline: warning: %s: %zu more lines skipped\n",
          path_.c_str(),
          count_ - kShown);
    }
  }
  void add(size_t line, const std::string& why) {
    if (++count_ <= kShown) {
      std::fprintf(
          stderr,
          "tide-timeline: warning: %s:%zu: skipped: %s\n",
          path_.c_str(),
          line,
          why.c_str());
    }
  }
  size_t count() const {
    return count_;
  }

 private:
  static constexpr size_t kShown = 10;
  std::string path_;
  size_t count_ = 0;
};

// Reads every line of `path`; throws Fatal when it cannot be read.
Input read_events(const std::string& path, Warnings& warnings);

// Keeps one run's events (those without a run_id too): `run_id`, or the
// file's last run (then written to run_id), since tiderun appends to an
// events file. Throws Fatal for a run_id the file does not hold.
std::vector<Record> select_run(
    std::vector<Record> records, const std::string& path, std::string& run_id);

}  // namespace tide::timeline
