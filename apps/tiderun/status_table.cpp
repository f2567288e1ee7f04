#include "status_table.h"

#include <iterator>
#include <optional>

#include <fmt/format.h>

namespace tiderun {

namespace {

using tide::status::JobView;

std::string duration_text(std::optional<double> s) {
  if (!s) {
    return "-";
  }
  return *s < 1 ? fmt::format("{:.0f}ms", *s * 1000)
                : fmt::format("{:.1f}s", *s);
}

std::string score_text(std::optional<double> s) {
  return s ? fmt::format("{:.2f}", *s) : "-";
}

template <typename T>
std::string or_dash(const std::optional<T>& v) {
  return v ? fmt::format("{}", *v) : "-";
}

// Why a node is not counted in the job's state, if it is not.
const char* membership(const JobView& v, const JobView::Node& n) {
  if (n.member) {
    return "";
  }
  return n.status.round < v.round && n.status.state == "STARTING"
             ? " (waiting to join)"
             : " (not in the current round)";
}

}  // namespace

std::string format_job_view(const JobView& v) {
  int stragglers = 0;
  int members = 0;
  for (const auto& n : v.nodes) {
    members += n.member ? 1 : 0;
    for (const auto& r : n.ranks) {
      stragglers += r.straggler ? 1 : 0;
    }
  }
  std::string out;
  auto to = std::back_inserter(out);
  fmt::format_to(
      to,
      "job {}: {}, round {}, {} node(s), {} rank(s), {} restart(s), {} "
      "straggler(s)",
      v.run_id,
      v.state,
      v.round,
      members,
      v.ranks,
      v.restarts,
      stragglers);
  if (members < static_cast<int>(v.nodes.size())) {
    fmt::format_to(
        to, ", {} other node(s) not in the round", v.nodes.size() - members);
  }
  out += "\n";
  for (const auto& n : v.nodes) {
    const auto& s = n.status;
    std::string restarts = fmt::format("{}/{}", s.restarts, s.max_restarts);
    if (s.last_restart_at > 0) {
      restarts += " (last: " + s.last_restart_reason + ")";
    }
    fmt::format_to(
        to,
        "\nnode {} (slot {}, group rank {} of {}, round {}): {}{}{}, restarts "
        "{}, updated {} ago\n",
        s.node,
        s.slot,
        s.group_rank,
        s.group_world_size,
        s.round,
        s.state,
        n.silent ? " (SILENT)" : "",
        membership(v, n),
        restarts,
        duration_text(n.age));
    if (s.ranks.empty()) {
      continue;
    }
    out +=
        "  rank  local  pid       state       beat    step      step time  "
        "best      relative  own\n";
    for (size_t i = 0; i < s.ranks.size(); ++i) {
      const auto& r = s.ranks[i];
      const JobView::Rank& sc = n.ranks[i];
      fmt::format_to(
          to,
          "  {:<5} {:<6} {:<9} {:<11} {:<7} {:<9} {:<10} {:<9} {:<9} {:<5}{}\n",
          r.rank,
          r.local_rank,
          r.pid,
          r.state,
          duration_text(r.beat_age),
          or_dash(r.step),
          duration_text(r.step_time),
          duration_text(r.best_step_time),
          score_text(sc.scores.relative),
          score_text(sc.scores.individual),
          sc.straggler ? "  STRAGGLER" : "");
    }
  }
  for (const auto& u : v.unreadable) {
    out += "unreadable record: " + u + "\n";
  }
  return out;
}

}  // namespace tiderun
