#include "tide/agent/worker_spec.h"

#include <charconv>
#include <csignal>
#include <cstring>

#include "tide/agent/entrypoint.h"
#include "tide/agent/worker.h"
#include "tide/common/error.h"
#include "tide/common/strings.h"
#include "tide/ft/quorum.h"

namespace tide::agent {

namespace {

Std parse_std(std::string_view v, const char* flag, const std::string& text) {
  if (v == "0") {
    return Std::kNone;
  }
  if (v == "1") {
    return Std::kOut;
  }
  if (v == "2") {
    return Std::kErr;
  }
  if (v == "3") {
    return Std::kAll;
  }
  throw InvalidArgument(
      std::string(flag) + " \"" + text +
      "\": each value must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)");
}

}  // namespace

Std StdSpec::for_rank(int local_rank) const {
  auto it = by_rank.find(local_rank);
  return it == by_rank.end() ? all : it->second;
}

StdSpec parse_std_spec(const std::string& text, const char* flag) {
  StdSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all = parse_std(text, flag, text);
    return spec;
  }
  for (std::string_view item : split(text, ',')) {
    auto colon = item.find(':');
    int rank = -1;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + colon, rank);
    if (colon == std::string_view::npos || ec != std::errc() ||
        ptr != item.data() + colon || rank < 0) {
      throw InvalidArgument(
          std::string(flag) + " \"" + text +
          "\": expected LOCAL_RANK:VALUE pairs such as 0:1,1:2");
    }
    spec.by_rank[rank] = parse_std(item.substr(colon + 1), flag, text);
  }
  return spec;
}

std::string entrypoint_name(const Entrypoint& e) {
  if (const auto* c = std::get_if<Command>(&e)) {
    return c->argv.empty() ? std::string("<empty command>") : c->argv[0];
  }
  return std::get<FunctionCall>(e).name;
}

void validate(const WorkerSpec& spec) {
  if (!spec.rdzv_handler) {
    throw InvalidArgument("WorkerSpec: rdzv_handler is null");
  }
  if (spec.local_world_size < 1) {
    throw InvalidArgument(
        "WorkerSpec: local_world_size must be at least 1, not " +
        std::to_string(spec.local_world_size));
  }
  if (spec.max_restarts < 0) {
    throw InvalidArgument("WorkerSpec: max_restarts must not be negative");
  }
  if (spec.monitor_interval.count() <= 0) {
    throw InvalidArgument("WorkerSpec: monitor_interval must be positive");
  }
  if (spec.status_interval.count() < 0) {
    throw InvalidArgument("WorkerSpec: status_interval must not be negative");
  }
  if (!(spec.straggler_threshold > 0 && spec.straggler_threshold <= 1)) {
    throw InvalidArgument(
        "WorkerSpec: straggler_threshold must be in (0, 1], not " +
        std::to_string(spec.straggler_threshold));
  }
  if (const auto& g = spec.replica_group; !g.store.empty()) {
    ft::QuorumClient::member_id(g.id, "0");  // the id's characters
    if (g.groups < 1 || g.min_size < 1 || g.min_size > g.groups) {
      throw InvalidArgument(
          "WorkerSpec: a replica group needs 1 <= min_size (" +
          std::to_string(g.min_size) + ") <= groups (" +
          std::to_string(g.groups) + ")");
    }
  }
  if (const auto* c = std::get_if<Command>(&spec.entrypoint)) {
    if (c->argv.empty() || c->argv[0].empty()) {
      throw InvalidArgument("WorkerSpec: the command is empty");
    }
  } else {
    const auto& f = std::get<FunctionCall>(spec.entrypoint);
    if (find_function(f.name) == nullptr) {
      throw InvalidArgument(
          "WorkerSpec: no function registered as \"" + f.name +
          "\" (tide::agent::register_function)");
    }
  }
}

const char* to_string(WorkerState s) {
  switch (s) {
    case WorkerState::kUnknown:
      return "UNKNOWN";
    case WorkerState::kInit:
      return "INIT";
    case WorkerState::kHealthy:
      return "HEALTHY";
    case WorkerState::kUnhealthy:
      return "UNHEALTHY";
    case WorkerState::kStopped:
      return "STOPPED";
    case WorkerState::kSucceeded:
      return "SUCCEEDED";
    case WorkerState::kFailed:
      return "FAILED";
  }
  return "UNKNOWN";
}

std::string ProcessFailure::signal_name() const {
  if (exitcode >= 0) {
    return "";
  }
  const char* abbrev = sigabbrev_np(-exitcode);
  return abbrev ? std::string("SIG") + abbrev
                : "SIG" + std::to_string(-exitcode);
}

const ProcessFailure* RunResult::root_cause() const {
  const ProcessFailure* first = nullptr;
  for (const auto& [rank, f] : failures) {
    if (first == nullptr || f.timestamp < first->timestamp) {
      first = &f;
    }
  }
  return first;
}

}  // namespace tide::agent
