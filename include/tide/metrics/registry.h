#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

// Native metrics: the counters, gauges and histograms of this process, kept
// in one process-wide registry and read in Prometheus' text format by
// exposition() (the health port's /metrics, tiderun --metrics prometheus).
// Unlike put_metric() (torch's API, which sends values to a handler), they
// are always kept, named and labelled by Prometheus' conventions:
//
//   tide_<part>_<what>_<unit>     tide_store_request_seconds
//   counters end in _total        tide_agent_restarts_total
//   durations are _seconds        histograms, observed in seconds
//   labels say who and which      role, run, node, rank, op, outcome, ...
//
//   static const auto restarts = tide::metrics::counter(
//       "tide_agent_restarts_total", "Restarts of the worker group.",
//       {{"role", "default"}, {"reason", "worker_failure"}});
//   restarts.inc();
//
// counter(), gauge() and histogram() return a handle to the series of that
// name and labels, made on first use and the same one ever after; the
// series lives as long as the process. A handle is a pointer: copy it, keep
// it, and use it on a hot path without another lookup (a lookup takes a
// lock and builds a key from the labels). The handles' methods are thread
// safe and take no lock but a histogram's own.
//
// prometheus-cpp keeps the series; this header does not expose it.
namespace tide::metrics {

// Label name -> value. Names as Prometheus allows ([a-zA-Z_][a-zA-Z0-9_]*,
// not starting with "__"); values anything.
using Labels = std::map<std::string, std::string>;
// A histogram's upper bounds, increasing (the +Inf bucket is implied).
using Buckets = std::vector<double>;

namespace detail {
struct Series;
}  // namespace detail

// A value that only goes up (restarts, requests, bytes).
class Counter {
 public:
  // Adds `by`; throws InvalidArgument when it is negative.
  void inc(double by = 1) const;
  double value() const;

 private:
  friend Counter counter(const std::string&, const std::string&, const Labels&);
  explicit Counter(detail::Series* series) : series_(series) {}
  detail::Series* series_;
};

// A value that goes up and down (workers running, keys held).
class Gauge {
 public:
  void set(double value) const;
  void inc(double by = 1) const;
  void dec(double by = 1) const;
  double value() const;

 private:
  friend Gauge gauge(const std::string&, const std::string&, const Labels&);
  explicit Gauge(detail::Series* series) : series_(series) {}
  detail::Series* series_;
};

// Observations (durations, in seconds) counted into buckets, with their
// count and sum: quantiles come from histogram_quantile() on the scraper.
class Histogram {
 public:
  void observe(double value) const;

 private:
  friend Histogram histogram(
      const std::string&, const std::string&, const Labels&, Buckets);
  explicit Histogram(detail::Series* series) : series_(series) {}
  detail::Series* series_;
};

// The series `name`{labels} of a counter, gauge or histogram, made on first
// use. `help` describes the metric (the first one given is kept). Thread
// safe. Throws InvalidArgument for a name or label name Prometheus refuses,
// a counter whose name does not end in _total, a histogram labelled "le",
// and a name already used for another kind of metric or, for a histogram,
// with other buckets.
Counter counter(
    const std::string& name,
    const std::string& help,
    const Labels& labels = {});
Gauge gauge(
    const std::string& name,
    const std::string& help,
    const Labels& labels = {});
// `buckets` empty: default_seconds_buckets().
Histogram histogram(
    const std::string& name,
    const std::string& help,
    const Labels& labels = {},
    Buckets buckets = {});

// 1 ms to 5 min: health checks, rendezvous rounds, restarts, rpc calls.
const Buckets& default_seconds_buckets();
// `count` bounds from `start`, each `factor` times the last (start > 0,
// factor > 1, count >= 1; InvalidArgument otherwise).
Buckets exponential_buckets(double start, double factor, int count);

// Every metric of this process in Prometheus' text format 0.0.4 (content
// type "text/plain; version=0.0.4"), families sorted by name. Thread safe.
std::string exposition();

// The value of one sample of exposition(), named as it is written there:
// "tide_store_requests_total{op=\"get\"}" (labels sorted by name),
// "tide_rpc_call_seconds_count{outcome=\"ok\"}"; nullopt when there is none.
// For tests and tools: it writes the whole exposition to read one line.
std::optional<double> sample_value(const std::string& sample);

// The content type of exposition()'s text, for an HTTP reply.
constexpr const char* kExpositionContentType = "text/plain; version=0.0.4";

}  // namespace tide::metrics
