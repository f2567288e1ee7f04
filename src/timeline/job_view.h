#pragma once

#include <optional>
#include <string>

#include "timeline/model.h"

// The timeline of a job view: the JSON of tiderun status --json and of the
// live page's GET /api/job (tide/status/job_status.h's to_json(JobView)).
// A view holds each node's attempts as its agent recorded them, not each
// worker's process, so each node is drawn as one lane of attempts (round,
// outcome, reason), under its agent's lane of restarts; the picture ends at
// the view's "now". In a job of more than 32 nodes, nodes whose attempts
// went alike (the same numbers, rounds and outcomes) share one lane, "n0
// and 511 more", so that the picture of 8,192 nodes that restarted together
// is a lane or two, the node that failed standing apart.
namespace tide::timeline {

// The timeline of `view`. Throws Fatal (events.h), naming what is wrong,
// when it is not a job view; fields of a node that are missing or of the
// wrong type are read as absent, since a view comes from a shared store.
Timeline timeline_of_job(const json& view);

// Whether `text` is a job view (one JSON object with "now" and a "nodes"
// array), and then the view; nullopt for anything else, such as an events
// file.
std::optional<json> as_job_view(const std::string& text);

}  // namespace tide::timeline
