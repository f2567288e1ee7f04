#include "rpc_core/call_metrics.h"

#include <array>

#include "tide/metrics/registry.h"

namespace tide::rpc_core {

namespace {

constexpr size_t kOutcomes = 3;

const char* outcome_name(size_t outcome) {
  static const char* const kNames[kOutcomes] = {"ok", "error", "timeout"};
  return kNames[outcome];
}

// The series, looked up once.
struct CallMetrics {
  std::array<metrics::Counter, kOutcomes> sent = by_outcome("sent");
  std::array<metrics::Counter, kOutcomes> received = by_outcome("received");
  std::array<metrics::Histogram, kOutcomes> seconds = seconds_by_outcome();
  metrics::Gauge pending = metrics::gauge(
      "tide_rpc_pending_calls",
      "Calls this process sent that have not ended yet.");

  static std::array<metrics::Counter, kOutcomes> by_outcome(
      const char* direction) {
    auto make = [direction](size_t outcome) {
      return metrics::counter(
          "tide_rpc_calls_total",
          "Calls this process sent or received, by how they ended.",
          {{"direction", direction}, {"outcome", outcome_name(outcome)}});
    };
    return {make(0), make(1), make(2)};
  }

  static std::array<metrics::Histogram, kOutcomes> seconds_by_outcome() {
    auto make = [](size_t outcome) {
      return metrics::histogram(
          "tide_rpc_call_seconds",
          "Time from a call's start to its end, for the calls this process "
          "sent.",
          {{"outcome", outcome_name(outcome)}},
          // 10 us to about 5 min.
          metrics::exponential_buckets(1e-5, 4, 13));
    };
    return {make(0), make(1), make(2)};
  }
};

CallMetrics& call_metrics() {
  static auto* m = new CallMetrics();
  return *m;
}

}  // namespace

void call_started() {
  call_metrics().pending.inc();
}

void call_ended(Outcome outcome, std::chrono::steady_clock::duration took) {
  auto& m = call_metrics();
  auto i = static_cast<size_t>(outcome);
  m.pending.dec();
  m.sent[i].inc();
  m.seconds[i].observe(std::chrono::duration<double>(took).count());
}

void call_served(Outcome outcome) {
  call_metrics().received[static_cast<size_t>(outcome)].inc();
}

}  // namespace tide::rpc_core
