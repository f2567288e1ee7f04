#pragma once

#include <string>

#include "tide/metrics/registry.h"

// torch's metric names (put_metric's "workers.default.remaining_restarts")
// as Prometheus names: what the Prometheus handler turns each into.
namespace tide::metrics::detail {

struct PrometheusName {
  // tide_<group>_<what>: the gauge of the last value put; <base>_total is
  // the counter of the positive values put.
  std::string base;
  // metric="<torch's name>", and the part of the name that says who:
  //   workers.<role>.<what>        role="<role>"
  //   health_check.<check>.<what>  check="<check>"
  Labels labels;
};

// group "torchelastic", name "workers.default.remaining_restarts" ->
// tide_torchelastic_workers_remaining_restarts{metric=..., role="default"};
// "SimpleElasticAgent._rendezvous.success" ->
// tide_torchelastic_simple_elastic_agent_rendezvous_success. Words are
// snake_case, anything but letters and digits is '_', and a trailing _total
// is dropped from the base (it belongs to the counter). Pure.
PrometheusName prometheus_name(
    const std::string& group, const std::string& name);

}  // namespace tide::metrics::detail
