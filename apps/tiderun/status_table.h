#pragma once

#include <string>

#include "tide/status/job_status.h"

namespace tiderun {

// The job's view as the table `tiderun status` prints: a line for the job,
// then a block for each node with a row for each of its ranks.
std::string format_job_view(const tide::status::JobView& v);

}  // namespace tiderun
