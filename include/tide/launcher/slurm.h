#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// What tiderun reads from Slurm when srun starts it: the settings torchrun
// users spell out by hand under srun (docs/clusters.md).
namespace tide::launcher {

// Expands a Slurm host list as `scontrol show hostnames` does:
// "node[01-04,07],login" -> node01 node02 node03 node04 node07 login. A
// range keeps its first bound's zero padding ("[08-11]" -> 08 09 10 11);
// several bracketed parts in one name multiply ("r[1-2]n[1-2]" -> r1n1 r1n2
// r2n1 r2n2). Throws InvalidArgument naming the list for an unbalanced
// bracket, a reversed or malformed range, or more than 1,000,000 names.
std::vector<std::string> expand_hostlist(std::string_view list);

// One srun task's view of its job: srun's variables, parsed.
struct SlurmStep {
  std::string job_id;              // SLURM_JOB_ID
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST, expanded
  int num_nodes = 0;               // SLURM_JOB_NUM_NODES (or SLURM_NNODES)
  int node_id = 0;                 // SLURM_NODEID: this node's place
  int tasks_on_node = 1;           // SLURM_NTASKS_PER_NODE, or from
                                   // SLURM_TASKS_PER_NODE for this node
};

// The step srun started this process in, from `env` (getenv by default);
// nullopt outside srun (no SLURM_JOB_ID, SLURM_STEP_ID and SLURM_NODEID: a
// batch script's own shell is not a step). Throws InvalidArgument naming
// the variable when one is malformed.
std::optional<SlurmStep> slurm_step(
    const std::function<const char*(const char*)>& env = {});

}  // namespace tide::launcher
