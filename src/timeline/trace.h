#pragma once

#include <string>

#include "timeline/model.h"

// The run in the Trace Event Format (the JSON that chrome://tracing and
// ui.perfetto.dev open), for zooming into a run too long or too wide for one
// picture:
//
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
//
// One process per node (pid: the node's place in the picture, from 1, since
// trace viewers treat pid 0 as the kernel's), named after its host; in it a
// thread for the agent (tid 1) and one per worker rank (tid: rank + 2, named
// "rank N"). Each worker process is a complete event ("ph": "X", named by
// its outcome) with its pid, attempt, outcome and error in args; a
// rendezvous that waited is a complete event over its wait; restarts, timer
// expiries, hangs, failed rendezvous rounds and health checks are instant
// events ("ph": "i") on their thread; each attempt's start is a global
// instant. From a job view, a node has an "attempts" thread (tid 2) of its
// attempts as complete events in place of its workers' threads. Times
// ("ts", "dur") are microseconds since the run's first event.
namespace tide::timeline {

std::string render_trace(const Timeline& timeline, const std::string& title);

}  // namespace tide::timeline
