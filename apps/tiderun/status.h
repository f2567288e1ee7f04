#pragma once

// `tiderun status`: a job's view from its status records in the rendezvous
// store, for people and scripts (docs/observability.md#tiderun-status).
namespace tiderun {

// Its exit statuses.
constexpr int kStatusHealthy = 0;      // healthy, or succeeded
constexpr int kStatusDegraded = 1;     // a node silent, a straggler, starting
constexpr int kStatusUsage = 2;        // bad flags
constexpr int kStatusFailed = 3;       // a node failed for good
constexpr int kStatusNoRecords = 4;    // no such job, or not started
constexpr int kStatusUnreachable = 5;  // the store cannot be read

// Runs `tiderun status ARGS` (argv[0] is "status").
int status_main(int argc, char** argv);

}  // namespace tiderun
