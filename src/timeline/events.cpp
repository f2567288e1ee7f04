#include "timeline/events.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "timeline/text.h"

namespace tide::timeline {

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

}  // namespace tide::timeline
