#pragma once

// tiderun --replica-groups N: one command runs N replica groups of the same
// job on this host (docs/fault_tolerance.md). It serves the quorum's store
// itself and runs one tiderun per group, each with this command's flags and
// --ft-store, --replica-group-id 0..N-1 and --num-replica-groups N added;
// a group's failure restarts that group alone (its --max-restarts), and the
// command ends when every group has: 0 when all succeeded, else the first
// failure's code. SIGINT and SIGTERM are passed on to every group.
namespace tiderun {

// argv: this process's; script_at: the index of the training script in it
// (the flags before it are copied to each group, less --replica-groups).
int run_replica_groups(int argc, char** argv, int script_at, int groups);

}  // namespace tiderun
