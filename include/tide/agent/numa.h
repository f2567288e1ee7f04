#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

// NUMA binding of the workers (torchrun's --numa-binding): the machine's
// NUMA topology as sysfs describes it, the plan that gives each local rank
// its CPUs and memory nodes, and the calls that read what this process may
// use. The agent applies a plan between fork and exec (worker_process.cpp);
// nothing here changes the calling process.
namespace tide::agent {

// How workers are bound.
enum class NumaBinding {
  kNone,         // not at all: the workers inherit the agent's affinity
  kNode,         // each to the CPUs and memory of one NUMA node
  kSocket,       // each to the CPUs and memory of every node on one socket
  kExclusive,    // each to its own share of one node's CPUs; that node's memory
  kCoreComplex,  // each to one last-level-cache group (a core complex, an L3
                 // slice) of one node; that node's memory
};

// "none", "node", "socket", "exclusive", "core-complex". Throws InvalidArgument
// for anything else, naming the allowed values.
NumaBinding parse_numa_binding(const std::string& text);
const char* to_string(NumaBinding binding);

// The Linux cpulist format ("0-3,8-11", as sysfs and /proc/<pid>/status
// write it): sorted, without duplicates. An empty or blank text is an empty
// list. Throws InvalidArgument for anything else.
std::vector<int> parse_cpulist(std::string_view text);
// The inverse: {0, 1, 2, 3, 8} -> "0-3,8"; {} -> "". Sorts its copy first.
std::string format_cpulist(std::vector<int> ids);

// The machine's NUMA nodes, each with its online CPUs.
struct Topology {
  struct Node {
    int id = 0;
    // physical_package_id of the node's first CPU; -1 for a node without
    // CPUs (memory only: CXL, HBM), which takes no ranks.
    int socket = -1;
    // Sorted.
    std::vector<int> cpus;
    // cpus grouped by physical core (hyperthread siblings), ordered by each
    // core's first CPU. Empty when unknown: each CPU is then its own core.
    std::vector<std::vector<int>> cores;
    // cpus grouped by the last-level cache they share (core complexes),
    // largest first, then by first CPU. Empty when unknown.
    std::vector<std::vector<int>> complexes;
  };
  // Ordered by id.
  std::vector<Node> nodes;
};

// Reads the topology under `sysfs_root` (the root of a sysfs tree; tests
// pass a fake one):
//   devices/system/node/node<N>/cpulist             each node's CPUs
//   devices/system/cpu/online                       narrows them, if present
//   devices/system/cpu/cpu<C>/topology/physical_package_id   its socket
//   devices/system/cpu/cpu<C>/topology/thread_siblings_list  its core, if
//                                                             present
//   devices/system/cpu/cpu<C>/cache/index<I>/{type,level,shared_cpu_list}
//       its highest-level unified or data cache's sharers (core-complex)
// Without devices/system/node (a kernel without NUMA) the machine is one
// node 0 holding every online CPU. Throws Error naming the file when a file
// it needs is missing or malformed.
Topology read_topology(const std::string& sysfs_root = "/sys");

// One local rank's binding.
struct RankBinding {
  // CPUs the worker may run on: sorted, never empty.
  std::vector<int> cpus;
  // Nodes its memory is bound to (MPOL_BIND); empty: not bound.
  std::vector<int> mem_nodes;
  // The NUMA nodes the rank was placed on (one; a socket's for kSocket).
  std::vector<int> nodes;
  // The socket of those nodes.
  int socket = -1;
};

// Binds `local_world_size` ranks: rank i goes to node i * N / local_world_size
// of the N nodes that have CPUs in `allowed_cpus` (the agent's own affinity,
// a container's cpuset), so neighbouring ranks share a node and the ranks
// spread evenly over the nodes. Every rank's cpus are within allowed_cpus.
//   kNode:      the node's CPUs; memory on the node.
//   kSocket:    the CPUs of every node on the node's socket; memory on those
//               nodes.
//   kExclusive: a contiguous share of the node's CPUs, disjoint from the
//               shares of the other ranks on the node, whole cores (all
//               hyperthreads of one) unless there are fewer cores than
//               ranks; memory on the node.
//   kCoreComplex: the j-th rank on a node gets the node's j-th core
//               complex (modulo their number; the whole node when the
//               caches are unknown); memory on the node.
// kNone gives an empty plan. Throws InvalidArgument when local_world_size is
// below 1, when no node has an allowed CPU, or (kExclusive) when a node has
// fewer allowed CPUs than ranks.
std::vector<RankBinding> plan_numa_binding(
    const Topology& topology,
    NumaBinding binding,
    int local_world_size,
    const std::vector<int>& allowed_cpus);

// Narrows each rank's mem_nodes to `allowed` (memory_nodes_allowed(): a
// fake topology may name nodes this kernel lacks). A rank left with no node
// gets none: its memory is not bound. Returns those ranks.
std::vector<int> restrict_memory_nodes(
    std::vector<RankBinding>& plan, const std::vector<int>& allowed);

// In words, for the agent's log: "NUMA node 0, CPUs 0-7, memory on node 0".
std::string describe(const RankBinding& binding);

// The variables a bound worker gets: TIDE_NUMA_BINDING (the mode),
// TIDE_NUMA_NODES, TIDE_CPU_AFFINITY, TIDE_MEMORY_NODES (cpulists; the last
// empty when memory is not bound).
std::vector<std::pair<std::string, std::string>> numa_env(
    NumaBinding binding, const RankBinding& rank);

// The CPUs the calling thread may run on (sched_getaffinity). Throws Error
// if the kernel will not say.
std::vector<int> current_affinity();

// The memory nodes the calling process may allocate on (get_mempolicy with
// MPOL_F_MEMS_ALLOWED: its cpuset's mems). Empty when the kernel will not
// say (no NUMA support, a seccomp filter).
std::vector<int> memory_nodes_allowed();

}  // namespace tide::agent
