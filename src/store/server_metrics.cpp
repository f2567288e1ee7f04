#include "store/server_metrics.h"

#include <cctype>
#include <string>

#include "store/wire.h"

namespace tide::store::detail {

ServerMetrics::ServerMetrics() {
  // Server-side time per request, from decoded to answered (a WAIT's
  // wait not included): 1 us to about 4 s.
  metrics::Buckets buckets = metrics::exponential_buckets(1e-6, 4, 12);
  for (auto op = static_cast<size_t>(wire::Op::kSet);
       op < wire::kNumOps;
       ++op) {
    std::string name = wire::op_name(static_cast<wire::Op>(op));
    for (char& c : name) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    by_op.push_back(ByOp{
        metrics::counter(
            "tide_store_requests_total",
            "Requests the store server handled, by operation.",
            {{"op", name}}),
        metrics::histogram(
            "tide_store_request_seconds",
            "Time the store server spent on a request, by operation.",
            {{"op", name}},
            buckets)});
  }
}

ServerMetrics& server_metrics() {
  static auto* m = new ServerMetrics();
  return *m;
}

}  // namespace tide::store::detail
