#include <cctype>
#include <map>
#include <mutex>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "tide/common/error.h"
#include "tide/metrics/metrics.h"

namespace tide::metrics {

struct PrometheusMetricHandler::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry =
      std::make_shared<prometheus::Registry>();
  std::mutex mutex;
  // By "<group>/<name>". Guarded by mutex.
  std::map<std::string, std::pair<prometheus::Gauge*, prometheus::Counter*>>
      series;
};

namespace {

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  }
  return out;
}

}  // namespace

PrometheusMetricHandler::PrometheusMetricHandler(const std::string& address)
    : impl_(std::make_unique<Impl>()) {
  try {
    impl_->exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    throw NetworkError(
        "cannot serve Prometheus metrics on " + address + ": " + e.what());
  }
  impl_->exposer->RegisterCollectable(impl_->registry);
}

PrometheusMetricHandler::~PrometheusMetricHandler() = default;

uint16_t PrometheusMetricHandler::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : static_cast<uint16_t>(ports.front());
}

void PrometheusMetricHandler::emit(const MetricData& data) {
  std::lock_guard lock(impl_->mutex);
  std::string key = data.group_name + "/" + data.name;
  auto it = impl_->series.find(key);
  if (it == impl_->series.end()) {
    std::string family =
        "tide_" + sanitize(data.group_name) + "_" + sanitize(data.name);
    auto& gauge = prometheus::BuildGauge()
                      .Name(family)
                      .Help("last value of " + data.name)
                      .Register(*impl_->registry)
                      .Add({{"metric", data.name}, {"group", data.group_name}});
    auto& counter =
        prometheus::BuildCounter()
            .Name(family + "_sum")
            .Help("sum of the values of " + data.name)
            .Register(*impl_->registry)
            .Add({{"metric", data.name}, {"group", data.group_name}});
    it = impl_->series.emplace(key, std::make_pair(&gauge, &counter)).first;
  }
  it->second.first->Set(static_cast<double>(data.value));
  if (data.value > 0) {
    it->second.second->Increment(static_cast<double>(data.value));
  }
}

}  // namespace tide::metrics
