// The process's native metrics on prometheus-cpp: its Registry keeps the
// families and series, its TextSerializer writes them out. What this file
// adds: one registry for the process, Prometheus' naming rules checked up
// front (as InvalidArgument), and a cache from name and labels to the series
// so that asking again costs a map lookup instead of prometheus-cpp's
// family-then-labels search.
#include "tide/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <variant>

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/text_serializer.h>

#include "tide/common/error.h"

#include "metrics/process_registry.h"

namespace tide::metrics {

namespace detail {

// What a handle points at: one of the three, owned by prometheus-cpp's
// family (which never removes it).
struct Series {
  prometheus::Counter* counter = nullptr;
  prometheus::Gauge* gauge = nullptr;
  prometheus::Histogram* histogram = nullptr;
};

}  // namespace detail

namespace {

using detail::Series;

using FamilyRef = std::variant<
    prometheus::Family<prometheus::Counter>*,
    prometheus::Family<prometheus::Gauge>*,
    prometheus::Family<prometheus::Histogram>*>;

const char* kind_name(size_t index) {
  static const char* const kNames[] = {"counter", "gauge", "histogram"};
  return kNames[index];
}

struct Registry {
  std::mutex mutex;
  // By name. Guarded by mutex.
  struct Family {
    FamilyRef ref;
    Buckets buckets;  // a histogram's
  };
  std::unordered_map<std::string, Family> families;
  // By series_key(). Guarded by mutex.
  std::unordered_map<std::string, std::unique_ptr<Series>> series;
};

Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

// Kind, name and labels as one string, each piece prefixed by its length
// (label values may hold any byte). The kind keeps a gauge from finding a
// counter of the same name (its family then says why not).
std::string series_key(
    char kind, const std::string& name, const Labels& labels) {
  std::string key(1, kind);
  auto piece = [&key](const std::string& s) {
    key += std::to_string(s.size());
    key += ':';
    key += s;
  };
  piece(name);
  for (const auto& [k, v] : labels) {
    piece(k);
    piece(v);
  }
  return key;
}

void check_names(const std::string& name, const Labels& labels) {
  if (!prometheus::CheckMetricName(name)) {
    throw InvalidArgument(
        "metric name \"" + name +
        "\" is not a Prometheus name: use letters, digits and '_', not "
        "starting with a digit (tide_<part>_<what>_<unit>)");
  }
  for (const auto& [label, value] : labels) {
    if (!prometheus::CheckLabelName(label)) {
      throw InvalidArgument(
          "metric " + name + ": label name \"" + label +
          "\" is not a Prometheus label name: use letters, digits and '_', "
          "not starting with a digit or \"__\"");
    }
  }
}

void check_buckets(const std::string& name, const Buckets& buckets) {
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i]) || (i > 0 && buckets[i] <= buckets[i - 1])) {
      throw InvalidArgument(
          "histogram " + name +
          ": bucket bounds must be finite and strictly increasing (bound " +
          std::to_string(i) + " is " + std::to_string(buckets[i]) + ")");
    }
  }
}

// The family `name` of metrics T, registered on first use. Under r.mutex.
template <typename T>
prometheus::Family<T>& family_of(
    Registry& r,
    const std::string& name,
    const std::string& help,
    const Buckets* buckets = nullptr) {
  auto it = r.families.find(name);
  if (it == r.families.end()) {
    auto& made =
        prometheus::detail::Builder<T>().Name(name).Help(help).Register(
            *detail::process_registry());
    Registry::Family entry{&made, buckets ? *buckets : Buckets{}};
    it = r.families.emplace(name, std::move(entry)).first;
  }
  auto* found = std::get_if<prometheus::Family<T>*>(&it->second.ref);
  if (found == nullptr) {
    throw InvalidArgument(
        "metric " + name + " is already a " +
        kind_name(it->second.ref.index()) +
        "; give the other metric another name");
  }
  if (buckets != nullptr && *buckets != it->second.buckets) {
    throw InvalidArgument(
        "histogram " + name +
        " already has other buckets; every series of a histogram must have "
        "the same buckets");
  }
  return **found;
}

// The series `name`{labels}, made by `make` (under the lock) on first use.
template <typename Make>
Series* find_or_make(
    char kind,
    const std::string& name,
    const Labels& labels,
    const Make& make) {
  Registry& r = registry();
  std::string key = series_key(kind, name, labels);
  std::lock_guard lock(r.mutex);
  auto it = r.series.find(key);
  if (it != r.series.end()) {
    return it->second.get();
  }
  check_names(name, labels);
  auto series = std::make_unique<Series>();
  try {
    make(r, *series);
  } catch (const std::invalid_argument& e) {
    // prometheus-cpp's own checks, should one of ours have missed it.
    throw InvalidArgument("metric " + name + ": " + e.what());
  }
  return r.series.emplace(std::move(key), std::move(series))
      .first->second.get();
}

}  // namespace

namespace detail {

const std::shared_ptr<prometheus::Registry>& process_registry() {
  static auto* r = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>());
  return *r;
}

}  // namespace detail

void Counter::inc(double by) const {
  if (by < 0) {
    throw InvalidArgument(
        "a counter only goes up: cannot add " + std::to_string(by) +
        " (use a gauge for a value that goes down)");
  }
  series_->counter->Increment(by);
}

double Counter::value() const {
  return series_->counter->Value();
}

void Gauge::set(double value) const {
  series_->gauge->Set(value);
}

void Gauge::inc(double by) const {
  series_->gauge->Increment(by);
}

void Gauge::dec(double by) const {
  series_->gauge->Decrement(by);
}

double Gauge::value() const {
  return series_->gauge->Value();
}

void Histogram::observe(double value) const {
  series_->histogram->Observe(value);
}

Counter counter(
    const std::string& name, const std::string& help, const Labels& labels) {
  return Counter(find_or_make('c', name, labels, [&](Registry& r, Series& s) {
    if (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0) {
      throw InvalidArgument(
          "counter " + name +
          ": a counter's name ends in _total (Prometheus' convention)");
    }
    auto& family = family_of<prometheus::Counter>(r, name, help);
    s.counter = &family.Add(labels);
  }));
}

Gauge gauge(
    const std::string& name, const std::string& help, const Labels& labels) {
  return Gauge(find_or_make('g', name, labels, [&](Registry& r, Series& s) {
    auto& family = family_of<prometheus::Gauge>(r, name, help);
    s.gauge = &family.Add(labels);
  }));
}

Histogram histogram(
    const std::string& name,
    const std::string& help,
    const Labels& labels,
    Buckets buckets) {
  return Histogram(find_or_make('h', name, labels, [&](Registry& r, Series& s) {
    if (labels.count("le") > 0) {
      throw InvalidArgument(
          "histogram " + name +
          ": \"le\" is the label of its buckets; name yours otherwise");
    }
    if (buckets.empty()) {
      buckets = default_seconds_buckets();
    }
    check_buckets(name, buckets);
    auto& family = family_of<prometheus::Histogram>(r, name, help, &buckets);
    s.histogram = &family.Add(labels, buckets);
  }));
}

const Buckets& default_seconds_buckets() {
  static const Buckets kBuckets = {
      0.001,
      0.0025,
      0.005,
      0.01,
      0.025,
      0.05,
      0.1,
      0.25,
      0.5,
      1,
      2.5,
      5,
      10,
      25,
      50,
      100,
      300};
  return kBuckets;
}

Buckets exponential_buckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    throw InvalidArgument(
        "exponential_buckets(" + std::to_string(start) + ", " +
        std::to_string(factor) + ", " + std::to_string(count) +
        "): expected start > 0, factor > 1 and count >= 1");
  }
  Buckets out;
  double bound = start;
  for (int i = 0; i < count; ++i) {
    out.push_back(bound);
    bound *= factor;
  }
  return out;
}

std::string exposition() {
  auto families = detail::process_registry()->Collect();
  std::stable_sort(
      families.begin(), families.end(), [](const auto& a, const auto& b) {
        return a.name < b.name;
      });
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

std::optional<double> sample_value(const std::string& sample) {
  std::string text = "\n" + exposition();
  auto at = text.find("\n" + sample + " ");
  if (at == std::string::npos) {
    return std::nullopt;
  }
  return std::strtod(text.c_str() + at + sample.size() + 2, nullptr);
}

}  // namespace tide::metrics
