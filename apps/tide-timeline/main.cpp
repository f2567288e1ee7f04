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
#include <errno.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

// A problem that ends the program with exit code 1 and this message.
struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- Text ------------------------------------------------------------------

// Escapes text for XML content and attribute values. Control characters XML
// 1.0 forbids become spaces, as do newlines unless keep_newlines.
std::string xml(const std::string& s, bool keep_newlines = false) {
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

// The rendered width of text in a sans-serif font, estimated generously so
// that labels placed side by side never touch.
double text_width(const std::string& s, double font_size) {
  return static_cast<double>(code_points(s)) * font_size * 0.6;
}

// The longest prefix of s (cut with an ellipsis) that fits in width pixels.
std::string fit(const std::string& s, double width, double font_size) {
  auto max_chars =
      static_cast<size_t>(std::max(0.0, width / (font_size * 0.6)));
  return max_chars < 4 ? "" : truncate(s, max_chars);
}

std::string num(double v, int decimals = 1) {
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
  return msg.empty() || msg == "<NONE>" ? "failed (no error message)"
                                        : truncate(msg, 90);
}

// ---- Reading -------------------------------------------------------------

std::optional<std::string> str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return std::nullopt;
  }
  if (it->is_string()) {
    return it->get<std::string>();
  }
  if (it->is_number() || it->is_boolean()) {
    return it->dump();
  }
  return std::nullopt;
}

std::optional<int64_t> integer(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) {
    return std::nullopt;
  }
  if (it->is_number_integer()) {
    return it->get<int64_t>();
  }
  if (it->is_number()) {
    return static_cast<int64_t>(it->get<double>());
  }
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0' && errno == 0) {
      return v;
    }
  }
  return std::nullopt;
}

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

Input read_events(const std::string& path, Warnings& warnings) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw Fatal("cannot read " + path + ": it is a directory");
  }
  std::ifstream in(path);
  if (!in) {
    throw Fatal("cannot read " + path + ": " + ::strerror(errno));
  }
  Input input;
  for (std::string line; std::getline(in, line);) {
    size_t n = ++input.lines;
    if (!line.empty() && line.back() == '\r') {
      line.pop_back();
    }
    if (one_line(line).empty()) {
      continue;
    }
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++input.malformed;
      warnings.add(n, "not a JSON object: " + truncate(one_line(line), 60));
      continue;
    }
    auto name = str(j, "name");
    if (!name) {
      continue;  // some other tool's line
    }
    Record r{.name = *name, .line = n};
    r.rdzv = str(j, "event_type").value_or("") == "rdzv";
    auto ts = integer(j, "timestamp");
    if (!ts || *ts <= 0) {
      ++input.malformed;
      warnings.add(n, "event " + *name + " has no timestamp");
      continue;
    }
    // torch stamps some events in seconds; tide in milliseconds.
    r.t_ms = *ts < 100'000'000'000 ? *ts * 1000 : *ts;
    if (r.rdzv) {
      r.body = std::move(j);
    } else if (auto md = j.find("metadata"); md != j.end() && md->is_object()) {
      r.body = std::move(*md);
    } else {
      r.body = json::object();
    }
    input.records.push_back(std::move(r));
  }
  if (in.bad()) {
    throw Fatal("cannot read " + path + ": " + ::strerror(errno));
  }
  return input;
}

// Keeps one run's events (those without a run_id too): the asked-for run, or
// the file's last, since tiderun appends to an events file.
std::vector<Record> select_run(
    std::vector<Record> records, const std::string& path, std::string& run_id) {
  std::vector<std::string> runs;
  for (const Record& r : records) {
    auto id = str(r.body, "run_id");
    if (id && std::find(runs.begin(), runs.end(), *id) == runs.end()) {
      runs.push_back(*id);
    }
  }
  if (run_id.empty() && runs.size() > 1) {
    run_id = runs.back();
    std::fprintf(
        stderr,
        "tide-timeline: %s holds %zu runs; drawing the last, %s (pick another "
        "with --run-id)\n",
        path.c_str(),
        runs.size(),
        run_id.c_str());
  } else if (run_id.empty() && runs.size() == 1) {
    run_id = runs.front();
  } else if (
      !run_id.empty() &&
      std::find(runs.begin(), runs.end(), run_id) == runs.end()) {
    std::string known;
    for (const auto& r : runs) {
      known += (known.empty() ? "" : ", ") + r;
    }
    throw Fatal(
        "no events of run " + run_id + " in " + path +
        "; runs there: " + (known.empty() ? "none" : known));
  }
  std::erase_if(records, [&](const Record& r) {
    auto id = str(r.body, "run_id");
    return id && *id != run_id;
  });
  return records;
}

// ---- The model -----------------------------------------------------------

enum class Outcome { kSucceeded, kFailed, kTerminated, kRunning };

const char* css_class(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return "succeeded";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kTerminated:
      return "terminated";
    case Outcome::kRunning:
      return "running";
  }
  return "running";
}

// One worker process, from its HEALTHY event to its end.
struct Bar {
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  bool start_seen = true;  // false: the file begins after the worker started
  Outcome outcome = Outcome::kRunning;
  std::string pid;
  int64_t attempt = 0;
  std::string error;  // raw_error, for FAILED
};

enum class Mark { kRendezvous, kRestart, kTimer, kFailure, kRdzvPending };

// A point (or, for a rendezvous, the span it waited) with a label.
struct Note {
  Mark mark;
  int64_t t_ms = 0;
  int64_t from_ms = 0;  // where a rendezvous began waiting
  std::string label;
  std::string tooltip;
};

struct WorkerLane {
  int64_t rank = 0;
  std::optional<int64_t> local_rank;
  std::string role;
  std::vector<Bar> bars;
  std::vector<Note> notes;
};

struct Boundary {
  int64_t t_ms = 0;
  std::string label;
};

struct Timeline {
  std::string run_id;
  int64_t t0 = 0;
  int64_t t1 = 0;
  std::map<std::string, std::vector<Note>> agent_notes;  // by host
  std::map<std::pair<std::string, int64_t>, WorkerLane> workers;
  std::map<std::string, int64_t> host_order;  // host -> its group rank
  std::vector<Boundary> boundaries;
  std::set<std::string> roles;
  int64_t attempts = 1;
};

std::string signal_text(int64_t sig) {
  const char* name =
      sig > 0 && sig < 65 ? sigabbrev_np(static_cast<int>(sig)) : nullptr;
  return name ? std::string("SIG") + name : "signal " + std::to_string(sig);
}

// Turns time-ordered records into a Timeline.
class Builder {
 public:
  Builder(const std::vector<Record>& records, Warnings& warnings)
      : warnings_(warnings) {
    tl_.t0 = records.front().t_ms;
    tl_.t1 = records.back().t_ms;
  }

  void add(const Record& r) {
    const json& md = r.body;
    std::string host = str(md, "hostname").value_or("?");
    if (r.rdzv) {
      rdzv_[host].push_back(&r);
      return;
    }
    if (r.name.rfind("torchelastic.", 0) != 0) {
      return;
    }
    int64_t restarts = integer(md, "agent_restarts").value_or(0);
    tl_.attempts = std::max(tl_.attempts, restarts + 1);
    if (auto g = integer(md, "group_rank"); g && !tl_.host_order.count(host)) {
      tl_.host_order[host] = *g;
    }
    if (r.name.rfind(kStatus, 0) == 0) {
      worker_status(r, host, restarts);
    } else if (r.name == "torchelastic.agent.rendezvous") {
      rendezvous(r, host);
    } else if (r.name == "torchelastic.agent.restart") {
      restart(r, host, restarts);
    } else if (r.name == "torchelastic.agent.timer_expired") {
      timer_expired(r, host);
    }
  }

  Timeline finish() && {
    for (auto& [key, lane] : tl_.workers) {
      for (Bar& bar : lane.bars) {
        if (bar.outcome == Outcome::kRunning) {
          bar.end_ms = tl_.t1;
        }
        if (bar.outcome == Outcome::kFailed) {
          lane.notes.push_back(Note{
              .mark = Mark::kFailure,
              .t_ms = bar.end_ms,
              .from_ms = bar.start_ms,
              .label = short_error(bar.error),
              .tooltip = "rank " + std::to_string(lane.rank) + " (pid " +
                         bar.pid + ") failed:\n" + bar.error});
        }
      }
    }
    for (auto& [key, lane] : tl_.workers) {
      // Failure messages get the first row under the bars.
      std::stable_partition(
          lane.notes.begin(), lane.notes.end(), [](const Note& n) {
            return n.mark == Mark::kFailure;
          });
    }
    place_rdzv_events();
    for (auto& [host, notes] : tl_.agent_notes) {
      std::stable_sort(
          notes.begin(), notes.end(), [](const Note& a, const Note& b) {
            return a.t_ms < b.t_ms;
          });
    }
    return std::move(tl_);
  }

 private:
  static constexpr std::string_view kStatus = "torchelastic.worker.status.";

  void worker_status(
      const Record& r, const std::string& host, int64_t restarts) {
    const json& md = r.body;
    std::string state = r.name.substr(kStatus.size());
    auto pid = str(md, "worker_id");
    auto rank = integer(md, "global_rank");
    if (!pid || !rank) {
      warnings_.add(r.line, r.name + " without worker_id or global_rank");
      return;
    }
    WorkerLane& lane = tl_.workers[{host, *rank}];
    lane.rank = *rank;
    lane.role = str(md, "role").value_or("");
    tl_.roles.insert(lane.role);
    if (auto inner = str(md, "metadata")) {
      json extra = json::parse(*inner, nullptr, false);
      if (extra.is_object()) {
        lane.local_rank = integer(extra, "local_rank");
      }
    }
    by_pid_[{host, *pid}] = &lane;
    auto it = open_.find({host, *pid});
    if (state == "HEALTHY") {
      if (it == open_.end()) {
        lane.bars.push_back(
            Bar{.start_ms = r.t_ms, .pid = *pid, .attempt = restarts});
        open_[{host, *pid}] = {&lane, lane.bars.size() - 1};
      }
      return;
    }
    Outcome outcome;
    if (state == "SUCCEEDED") {
      outcome = Outcome::kSucceeded;
    } else if (state == "FAILED") {
      outcome = Outcome::kFailed;
    } else if (state == "TERMINATED" || state == "STOPPED") {
      outcome = Outcome::kTerminated;
    } else {
      return;  // INIT, UNHEALTHY, UNKNOWN: no change to draw
    }
    Bar* bar = nullptr;
    if (it != open_.end()) {
      bar = &it->second.first->bars[it->second.second];
      open_.erase(it);
    } else {
      lane.bars.push_back(
          Bar{.start_ms = tl_.t0,
              .start_seen = false,
              .pid = *pid,
              .attempt = restarts});
      bar = &lane.bars.back();
    }
    bar->end_ms = r.t_ms;
    bar->outcome = outcome;
    if (outcome == Outcome::kFailed) {
      bar->error = str(md, "raw_error").value_or("");
    }
  }

  void rendezvous(const Record& r, const std::string& host) {
    const json& md = r.body;
    int64_t waited =
        std::max<int64_t>(0, integer(md, "duration_ms").value_or(0));
    std::string label = "rendezvous";
    if (auto ws = integer(md, "group_world_size")) {
      label += ": world size " + std::to_string(*ws);
    }
    if (waited > 0) {
      label +=
          " (waited " +
          (waited < 1000 ? std::to_string(waited) + " ms"
                         : seconds_text(static_cast<double>(waited) / 1000)) +
          ")";
    }
    tl_.agent_notes[host].push_back(Note{
        .mark = Mark::kRendezvous,
        .t_ms = r.t_ms,
        .from_ms = r.t_ms - waited,
        .label = label,
        .tooltip = label + "\ngroup rank " +
                   str(md, "group_rank").value_or("?") + ", master " +
                   str(md, "master_endpoint").value_or("?")});
  }

  void restart(const Record& r, const std::string& host, int64_t restarts) {
    std::string label =
        "restart: " + str(r.body, "reason").value_or("unknown reason");
    if (auto left = integer(r.body, "remaining_restarts")) {
      label += " (" + std::to_string(*left) + " left)";
    }
    tl_.agent_notes[host].push_back(Note{
        .mark = Mark::kRestart,
        .t_ms = r.t_ms,
        .label = label,
        .tooltip = label + "\nthen attempt " + std::to_string(restarts)});
    tl_.boundaries.push_back(Boundary{
        .t_ms = r.t_ms, .label = "attempt " + std::to_string(restarts)});
  }

  void timer_expired(const Record& r, const std::string& host) {
    const json& md = r.body;
    std::string pid = str(md, "worker_id").value_or("?");
    std::string label = "timer expired";
    if (auto scope = str(md, "scope_id")) {
      label += ": " + truncate(one_line(*scope), 40);
    }
    if (auto over = integer(md, "overrun_ms"); over && *over > 0) {
      label += " +" + std::to_string(*over) + " ms";
    }
    if (auto sig = integer(md, "signal")) {
      label += ", " + signal_text(*sig);
    }
    Note note{
        .mark = Mark::kTimer,
        .t_ms = r.t_ms,
        .label = label,
        .tooltip = label + "\nworker pid " + pid};
    auto lane = by_pid_.find({host, pid});
    if (lane != by_pid_.end()) {
      lane->second->notes.push_back(std::move(note));
    } else {
      tl_.agent_notes[host].push_back(std::move(note));
    }
  }

  // Rendezvous events go on their host's agent lane; a host name that no
  // agent event uses goes on the only host's, if there is one. Failed rounds
  // are drawn, and a round still joining at the end of the file.
  void place_rdzv_events() {
    std::set<std::string> hosts;
    for (const auto& [host, notes] : tl_.agent_notes) {
      hosts.insert(host);
    }
    for (const auto& [key, lane] : tl_.workers) {
      hosts.insert(key.first);
    }
    for (const auto& [rdzv_host, events] : rdzv_) {
      std::string host = rdzv_host;
      if (!hosts.count(host) && hosts.size() == 1) {
        host = *hosts.begin();
      }
      std::vector<Note>& notes = tl_.agent_notes[host];
      for (const Record* r : events) {
        std::string message = one_line(str(r->body, "message").value_or(""));
        std::string trace = str(r->body, "error_trace").value_or("");
        if (str(r->body, "node_state") == "FAILED" || !trace.empty()) {
          notes.push_back(Note{
              .mark = Mark::kFailure,
              .t_ms = r->t_ms,
              .label =
                  "rendezvous failed: " +
                  truncate(message.empty() ? one_line(trace) : message, 80),
              .tooltip = message + "\n" + trace});
        }
      }
      const Record* last = events.back();
      bool done = std::any_of(notes.begin(), notes.end(), [&](const Note& n) {
        return n.mark == Mark::kRendezvous && n.t_ms >= last->t_ms;
      });
      if (!done && str(last->body, "node_state") == "INIT") {
        std::string message = one_line(str(last->body, "message").value_or(""));
        notes.push_back(Note{
            .mark = Mark::kRdzvPending,
            .t_ms = last->t_ms,
            .label = "in rendezvous: " + truncate(message, 80),
            .tooltip = message});
      }
    }
  }

  Timeline tl_;
  Warnings& warnings_;
  // The bar of each live worker, by (host, pid).
  std::map<std::pair<std::string, std::string>, std::pair<WorkerLane*, size_t>>
      open_;
  std::map<std::pair<std::string, std::string>, WorkerLane*> by_pid_;
  // Rendezvous events by their own hostname, placed once all agent events
  // are in (their hostname need not match the agent's).
  std::map<std::string, std::vector<const Record*>> rdzv_;
};

// ---- Drawing -------------------------------------------------------------

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(
        stderr, "%s\ntide-timeline: error: %s\n", app.help().c_str(), e.what());
    return 2;
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
    Builder builder(records, warnings);
    for (const Record& r : records) {
      builder.add(r);
    }
    Timeline tl = std::move(builder).finish();
    tl.run_id = run_id;
    if (title.empty()) {
      title = "Timeline of " +
              std::filesystem::path(input_path).filename().string();
    }
    std::string svg = Renderer(tl, title).svg();
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
