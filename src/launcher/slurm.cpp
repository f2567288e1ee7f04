#include "tide/launcher/slurm.h"

#include <cstdlib>

#include "tide/common/error.h"
#include "tide/common/numbers.h"
#include "tide/common/strings.h"

namespace tide::launcher {

namespace {

constexpr size_t kMaxHosts = 1'000'000;

[[noreturn]] void bad_list(std::string_view list, const std::string& why) {
  throw InvalidArgument("host list \"" + std::string(list) + "\": " + why);
}

bool parse_number(std::string_view text, long& out) {
  auto v = to_integer<long>(text);
  out = v.value_or(-1);
  return out >= 0;
}

// "01-04,07" -> 01 02 03 04 07, each padded to its range's first bound.
std::vector<std::string> expand_ranges(
    std::string_view ranges, std::string_view list) {
  std::vector<std::string> out;
  for (std::string_view item : split(ranges, ',')) {
    auto dash = item.find('-');
    std::string_view lo_text = item.substr(0, dash);
    std::string_view hi_text =
        dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    long lo = 0;
    long hi = 0;
    if (!parse_number(lo_text, lo) || !parse_number(hi_text, hi)) {
      bad_list(list, "\"" + std::string(item) + "\" is not N or N-M");
    }
    if (hi < lo) {
      bad_list(list, "the range " + std::string(item) + " runs backwards");
    }
    if (static_cast<size_t>(hi - lo) + out.size() >= kMaxHosts) {
      bad_list(list, "more than 1,000,000 hosts");
    }
    for (long n = lo; n <= hi; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo_text.size()) {
        digits.insert(0, lo_text.size() - digits.size(), '0');
      }
      out.push_back(std::move(digits));
    }
  }
  return out;
}

// One name with its bracketed parts: "r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2.
void expand_name(
    std::string_view name,
    std::string_view list,
    std::vector<std::string>& out) {
  std::vector<std::string> names = {""};
  while (!name.empty()) {
    auto open = name.find('[');
    std::string_view text = name.substr(0, open);
    for (auto& n : names) {
      n += text;
    }
    if (open == std::string_view::npos) {
      break;
    }
    auto close = name.find(']', open);
    if (close == std::string_view::npos) {
      bad_list(list, "a '[' is never closed");
    }
    auto parts = expand_ranges(name.substr(open + 1, close - open - 1), list);
    if (parts.empty()) {
      bad_list(list, "empty brackets");
    }
    if (names.size() * parts.size() > kMaxHosts) {
      bad_list(list, "more than 1,000,000 hosts");
    }
    std::vector<std::string> next;
    next.reserve(names.size() * parts.size());
    for (const auto& n : names) {
      for (const auto& p : parts) {
        next.push_back(n + p);
      }
    }
    names = std::move(next);
    name = name.substr(close + 1);
  }
  for (auto& n : names) {
    if (n.empty()) {
      bad_list(list, "an empty host name");
    }
    out.push_back(std::move(n));
  }
}

int parse_count(const char* var, const char* text) {
  long v = 0;
  if (!parse_number(text, v) || v > 1'000'000) {
    throw InvalidArgument(
        std::string(var) + "=\"" + text + "\" is not a count");
  }
  return static_cast<int>(v);
}

// SLURM_TASKS_PER_NODE ("2(x3),1"): the tasks on node `node_id`.
int tasks_on(const char* text, int node_id) {
  int node = 0;
  for (std::string_view item : split(text, ',')) {
    auto paren = item.find("(x");
    int tasks = parse_count(
        "SLURM_TASKS_PER_NODE", std::string(item.substr(0, paren)).c_str());
    int repeat = 1;
    if (paren != std::string_view::npos) {
      if (item.back() != ')') {
        throw InvalidArgument(
            std::string("SLURM_TASKS_PER_NODE=\"") + text +
            "\" is not N(xM),...");
      }
      std::string count(item.substr(paren + 2, item.size() - paren - 3));
      repeat = parse_count("SLURM_TASKS_PER_NODE", count.c_str());
    }
    if (node_id < node + repeat) {
      return tasks;
    }
    node += repeat;
  }
  return 1;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  // Split at the commas outside brackets.
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') {
      if (++depth > 1) {
        bad_list(list, "brackets do not nest");
      }
    } else if (i < list.size() && list[i] == ']') {
      if (--depth < 0) {
        bad_list(list, "a ']' closes nothing");
      }
    } else if (i == list.size() || (list[i] == ',' && depth == 0)) {
      std::string_view name = trim(list.substr(start, i - start));
      if (!name.empty()) {
        expand_name(name, list, out);
      }
      start = i + 1;
    }
  }
  if (depth != 0) {
    bad_list(list, "a '[' is never closed");
  }
  return out;
}

std::optional<SlurmStep> slurm_step(
    const std::function<const char*(const char*)>& env) {
  auto get = [&](const char* var) -> const char* {
    const char* v = env ? env(var) : std::getenv(var);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  const char* job = get("SLURM_JOB_ID");
  const char* node_id = get("SLURM_NODEID");
  if (job == nullptr || node_id == nullptr || get("SLURM_STEP_ID") == nullptr) {
    return std::nullopt;
  }
  SlurmStep step;
  step.job_id = job;
  step.node_id = parse_count("SLURM_NODEID", node_id);
  const char* list = get("SLURM_JOB_NODELIST");
  if (list == nullptr) {
    list = get("SLURM_NODELIST");
  }
  if (list != nullptr) {
    step.nodes = expand_hostlist(list);
  }
  const char* count = get("SLURM_JOB_NUM_NODES");
  if (count == nullptr) {
    count = get("SLURM_NNODES");
  }
  step.num_nodes = count != nullptr ? parse_count("SLURM_JOB_NUM_NODES", count)
                                    : static_cast<int>(step.nodes.size());
  if (const char* n = get("SLURM_NTASKS_PER_NODE")) {
    step.tasks_on_node = parse_count("SLURM_NTASKS_PER_NODE", n);
  } else if (const char* t = get("SLURM_TASKS_PER_NODE")) {
    step.tasks_on_node = tasks_on(t, step.node_id);
  }
  if (step.node_id >= step.num_nodes && step.num_nodes > 0) {
    throw InvalidArgument(
        "SLURM_NODEID=" + std::to_string(step.node_id) + " is not below " +
        "SLURM_JOB_NUM_NODES=" + std::to_string(step.num_nodes));
  }
  return step;
}

}  // namespace tide::launcher
