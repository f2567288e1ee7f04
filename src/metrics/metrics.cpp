#include "tide/metrics/metrics.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

namespace tide::metrics {

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

struct Config {
  std::mutex mutex;
  std::shared_ptr<MetricHandler> fallback =
      std::make_shared<NullMetricHandler>();
  std::map<std::string, std::shared_ptr<MetricHandler>> by_group;
};

Config& config() {
  static Config* c = new Config();
  return *c;
}

std::shared_ptr<MetricHandler> handler_for(const std::string& group) {
  auto& c = config();
  std::lock_guard lock(c.mutex);
  auto it = c.by_group.find(group);
  return it != c.by_group.end() ? it->second : c.fallback;
}

}  // namespace

void ConsoleMetricHandler::emit(const MetricData& data) {
  std::printf(
      "[%.3f][%s]: %s=%lld\n",
      data.timestamp,
      data.group_name.c_str(),
      data.name.c_str(),
      static_cast<long long>(data.value));
  std::fflush(stdout);
}

void configure(
    std::shared_ptr<MetricHandler> handler, const std::string& group) {
  if (!handler) {
    handler = std::make_shared<NullMetricHandler>();
  }
  auto& c = config();
  std::lock_guard lock(c.mutex);
  if (group.empty()) {
    c.fallback = std::move(handler);
  } else {
    c.by_group[group] = std::move(handler);
  }
}

void put_metric(
    const std::string& name, int64_t value, const std::string& group) {
  auto handler = handler_for(group);
  if (dynamic_cast<NullMetricHandler*>(handler.get()) != nullptr) {
    return;
  }
  handler->emit(MetricData{
      .timestamp = now_s(), .group_name = group, .name = name, .value = value});
}

Profile::Profile(std::string key, std::string group)
    : key_(std::move(key)),
      group_(std::move(group)),
      start_(now_s()),
      exceptions_(std::uncaught_exceptions()) {}

Profile::~Profile() {
  bool failed = std::uncaught_exceptions() > exceptions_;
  put_metric(key_ + (failed ? ".failure" : ".success"), 1, group_);
  put_metric(
      key_ + ".duration.ms",
      static_cast<int64_t>((now_s() - start_) * 1000),
      group_);
}

}  // namespace tide::metrics
