#pragma once

#include <cstdint>
#include <vector>

#include "tide/metrics/registry.h"

namespace tide::store::detail {

// The server's native metrics (docs/observability.md), looked up once: the
// loop holds the handles. Shared by the servers of a process, so the gauges
// move by differences (each server adds what it holds).
//
// Requests are all counted, but only one in kTimeOneIn of each operation is
// timed: two clock reads cost about 80 ns here (kvm-clock) and an
// observation 30 more, against about 3 us of server CPU per request, so
// timing every request cost some 4%; the sample, the counters and the byte
// counts together cost about 110 instructions a request, 1-1.5% of the
// server's CPU (docs/benchmarks.md). The sample's quantiles are the
// distribution's.
inline constexpr uint32_t kTimeOneIn = 16;

struct ServerMetrics {
  struct ByOp {
    metrics::Counter requests;
    metrics::Histogram seconds;
  };
  std::vector<ByOp> by_op;  // By wire::Op.
  metrics::Counter bad_requests = metrics::counter(
      "tide_store_bad_requests_total",
      "Requests the store server refused as malformed (the connection is "
      "closed; the server goes on).");
  metrics::Counter bytes_received = metrics::counter(
      "tide_store_bytes_received_total",
      "Bytes the store server read from its clients.");
  metrics::Counter bytes_sent = metrics::counter(
      "tide_store_bytes_sent_total",
      "Bytes the store server wrote to its clients.");
  metrics::Gauge clients = metrics::gauge(
      "tide_store_clients", "Connections open to the store servers.");
  metrics::Gauge keys =
      metrics::gauge("tide_store_keys", "Keys held by the store servers.");

  ServerMetrics();
};

// The process's one set.
ServerMetrics& server_metrics();

}  // namespace tide::store::detail
