// torch's metrics on Prometheus: each put_metric() becomes a gauge and a
// counter of the process's registry (registry.h), which prometheus-cpp's
// exposer serves whole, the native metrics included.
#include <mutex>
#include <unordered_map>

#include <prometheus/exposer.h>

#include "tide/common/error.h"
#include "tide/metrics/metrics.h"
#include "tide/metrics/registry.h"

#include "metrics/process_registry.h"
#include "metrics/torch_names.h"

namespace tide::metrics {

struct PrometheusMetricHandler::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::mutex mutex;
  struct Series {
    Gauge last;
    Counter sum;
  };
  // By "<group>/<name>": the names are converted once. Guarded by mutex.
  std::unordered_map<std::string, Series> series;
};

PrometheusMetricHandler::PrometheusMetricHandler(const std::string& address)
    : impl_(std::make_unique<Impl>()) {
  try {
    impl_->exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    throw NetworkError(
        "cannot serve Prometheus metrics on " + address + ": " + e.what());
  }
  impl_->exposer->RegisterCollectable(detail::process_registry());
}

PrometheusMetricHandler::~PrometheusMetricHandler() = default;

uint16_t PrometheusMetricHandler::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : static_cast<uint16_t>(ports.front());
}

void PrometheusMetricHandler::emit(const MetricData& data) {
  std::string key = data.group_name + "/" + data.name;
  Impl::Series* s = nullptr;
  {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->series.find(key);
    if (it == impl_->series.end()) {
      auto p = detail::prometheus_name(data.group_name, data.name);
      Impl::Series made{
          gauge(p.base, "last value of torch's metric " + data.name, p.labels),
          counter(
              p.base + "_total",
              "sum of the values of torch's metric " + data.name,
              p.labels)};
      it = impl_->series.emplace(std::move(key), made).first;
    }
    s = &it->second;
  }
  s->last.set(static_cast<double>(data.value));
  if (data.value > 0) {
    s->sum.inc(static_cast<double>(data.value));
  }
}

}  // namespace tide::metrics
