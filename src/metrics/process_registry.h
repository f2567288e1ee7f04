#pragma once

#include <memory>

#include <prometheus/registry.h>

// The prometheus-cpp registry behind counter(), gauge() and histogram()
// (registry.cpp), for the metrics part's own users of it: the Prometheus
// handler serves it and puts torch's metrics in it.
namespace tide::metrics::detail {

// The process's registry; never destroyed (threads may emit until exit).
// Thread safe.
const std::shared_ptr<prometheus::Registry>& process_registry();

}  // namespace tide::metrics::detail
