#include "tide/agent/numa.h"

#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "agent/group_processes.h"

namespace tide::agent {

namespace fs = std::filesystem;

namespace {

// Bounds what a cpulist may expand to: Linux has at most 8192 CPUs
// (CONFIG_NR_CPUS) and 1024 nodes, and "0-2000000000" must not take
// gigabytes.
constexpr int kMaxId = 1 << 16;
constexpr size_t kWordBits = sizeof(unsigned long) * CHAR_BIT;

std::optional<int> parse_id(std::string_view s) {
  int v = -1;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v < 0 ||
      v >= kMaxId) {
    return std::nullopt;
  }
  return v;
}

// The whole file, or nullopt when it does not exist. Throws Error when it
// exists but cannot be read.
std::optional<std::string> read_optional(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    int err = errno;
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return std::nullopt;
    }
    throw Error("cannot read " + path.string() + ": " + std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string read_required(const fs::path& path, const char* what) {
  auto text = read_optional(path);
  if (!text) {
    throw Error(
        "cannot read " + path.string() + " (" + what +
        "): no such file; is the sysfs root right?");
  }
  return *text;
}

std::vector<int> cpulist_of_file(
    const fs::path& path, const std::string& text) {
  try {
    return parse_cpulist(text);
  } catch (const InvalidArgument& e) {
    throw Error("malformed " + path.string() + ": " + e.what());
  }
}

std::optional<std::vector<int>> read_optional_cpulist(const fs::path& path) {
  auto text = read_optional(path);
  if (!text) {
    return std::nullopt;
  }
  return cpulist_of_file(path, *text);
}

int read_socket(const fs::path& cpu_dir, int cpu) {
  fs::path path = cpu_dir / ("cpu" + std::to_string(cpu)) / "topology" /
                  "physical_package_id";
  std::string text = read_required(path, "the CPU's socket");
  std::string_view v = trim(text);
  int socket = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), socket);
  // -1 where the firmware does not say.
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() ||
      socket < -1) {
    throw Error(
        "malformed " + path.string() + ": expected a socket number, got \"" +
        std::string(v) + "\"");
  }
  return socket;
}

// The node's CPUs grouped by thread_siblings_list; empty when no CPU has the
// file.
std::vector<std::vector<int>> read_cores(
    const fs::path& cpu_dir, const std::vector<int>& cpus) {
  std::map<int, std::vector<int>> by_core;  // first sibling -> CPUs
  bool known = false;
  for (int cpu : cpus) {
    fs::path path = cpu_dir / ("cpu" + std::to_string(cpu)) / "topology" /
                    "thread_siblings_list";
    int core = cpu;
    if (auto siblings = read_optional_cpulist(path)) {
      known = true;
      if (std::ranges::binary_search(*siblings, cpu)) {
        core = siblings->front();
      }
    }
    by_core[core].push_back(cpu);
  }
  if (!known) {
    return {};
  }
  std::vector<std::vector<int>> cores;
  for (auto& [first, members] : by_core) {
    cores.push_back(std::move(members));
  }
  std::ranges::sort(cores, {}, [](const auto& c) { return c.front(); });
  return cores;
}

// cpus grouped by the last-level cache they share (a core complex: an
// L3 slice), each group sorted; ordered largest first, then by first CPU.
// Empty when no CPU names its caches.
std::vector<std::vector<int>> read_complexes(
    const fs::path& cpu_dir, const std::vector<int>& cpus) {
  std::map<int, std::vector<int>> by_cache;  // first sharer -> CPUs
  bool known = false;
  for (int cpu : cpus) {
    // The highest-level unified or data cache this CPU has.
    int best_level = -1;
    std::vector<int> sharers;
    std::error_code ec;
    fs::path cache_dir = cpu_dir / ("cpu" + std::to_string(cpu)) / "cache";
    for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
      if (entry.path().filename().string().rfind("index", 0) != 0) {
        continue;
      }
      std::ifstream type_in(entry.path() / "type");
      std::ifstream level_in(entry.path() / "level");
      std::string type;
      int level = -1;
      if (!(type_in >> type) || !(level_in >> level) ||
          (type != "Unified" && type != "Data") || level <= best_level) {
        continue;
      }
      if (auto list = read_optional_cpulist(entry.path() / "shared_cpu_list")) {
        best_level = level;
        sharers = std::move(*list);
      }
    }
    int key = cpu;
    if (best_level >= 0 && std::ranges::binary_search(sharers, cpu)) {
      known = true;
      key = sharers.front();
    }
    by_cache[key].push_back(cpu);
  }
  if (!known) {
    return {};
  }
  std::vector<std::vector<int>> out;
  for (auto& [first, members] : by_cache) {
    out.push_back(std::move(members));
  }
  std::ranges::stable_sort(
      out, [](const auto& a, const auto& b) { return a.size() > b.size(); });
  return out;
}

// a's members that are in sorted_b, sorted.
std::vector<int> intersect(
    std::vector<int> a, const std::vector<int>& sorted_b) {
  std::ranges::sort(a);
  std::vector<int> out;
  std::ranges::set_intersection(a, sorted_b, std::back_inserter(out));
  return out;
}

std::string plural(size_t n, const char* one, const char* many) {
  return n == 1 ? one : many;
}

}  // namespace

NumaBinding parse_numa_binding(const std::string& text) {
  for (NumaBinding b :
       {NumaBinding::kNone,
        NumaBinding::kNode,
        NumaBinding::kSocket,
        NumaBinding::kExclusive,
        NumaBinding::kCoreComplex}) {
    if (text == to_string(b)) {
      return b;
    }
  }
  throw InvalidArgument(
      "--numa-binding=" + text +
      ": expected none, node, socket, exclusive or core-complex");
}

const char* to_string(NumaBinding binding) {
  switch (binding) {
    case NumaBinding::kNone:
      return "none";
    case NumaBinding::kNode:
      return "node";
    case NumaBinding::kSocket:
      return "socket";
    case NumaBinding::kExclusive:
      return "exclusive";
    case NumaBinding::kCoreComplex:
      return "core-complex";
  }
  return "?";
}

std::vector<int> parse_cpulist(std::string_view text) {
  std::vector<int> out;
  std::string_view list = trim(text);
  for (std::string_view item : split(list, ',')) {
    auto dash = item.find('-');
    auto lo = parse_id(item.substr(0, dash));
    auto hi =
        dash == std::string_view::npos ? lo : parse_id(item.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) {
      throw InvalidArgument(
          "\"" + std::string(list) +
          "\" is not a cpulist (expected ranges of ids below " +
          std::to_string(kMaxId) + " such as 0-3,8-11)");
    }
    for (int id = *lo; id <= *hi; ++id) {
      out.push_back(id);
    }
  }
  std::ranges::sort(out);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpulist(std::vector<int> ids) {
  std::ranges::sort(ids);
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) {
      ++j;
    }
    if (!out.empty()) {
      out += ',';
    }
    out += std::to_string(ids[i]);
    if (j > i) {
      out += '-' + std::to_string(ids[j]);
    }
    i = j + 1;
  }
  return out;
}

Topology read_topology(const std::string& sysfs_root) {
  const fs::path node_dir = fs::path(sysfs_root) / "devices/system/node";
  const fs::path cpu_dir = fs::path(sysfs_root) / "devices/system/cpu";
  const auto online = read_optional_cpulist(cpu_dir / "online");

  Topology topology;
  std::error_code ec;
  if (fs::is_directory(node_dir, ec)) {
    for (const auto& entry : fs::directory_iterator(node_dir, ec)) {
      std::string name = entry.path().filename().string();
      std::optional<int> id;
      if (name.rfind("node", 0) == 0) {
        id = parse_id(std::string_view(name).substr(4));
      }
      if (!id) {
        continue;  // has_cpu, online, possible, power, ...
      }
      fs::path path = entry.path() / "cpulist";
      topology.nodes.push_back(
          {.id = *id,
           .cpus =
               cpulist_of_file(path, read_required(path, "a node's CPUs"))});
    }
    if (ec) {
      throw Error("cannot list " + node_dir.string() + ": " + ec.message());
    }
  }
  if (topology.nodes.empty()) {
    // A kernel without NUMA: one node holding every CPU.
    if (!online) {
      throw Error(
          "cannot read the CPU topology under " + sysfs_root + ": neither " +
          node_dir.string() + " nor " + (cpu_dir / "online").string() +
          " exists");
    }
    topology.nodes.push_back({.id = 0, .cpus = *online});
  }
  std::ranges::sort(topology.nodes, {}, &Topology::Node::id);
  for (Topology::Node& node : topology.nodes) {
    if (online) {
      node.cpus = intersect(node.cpus, *online);
    }
    if (!node.cpus.empty()) {
      node.socket = read_socket(cpu_dir, node.cpus.front());
      node.cores = read_cores(cpu_dir, node.cpus);
      node.complexes = read_complexes(cpu_dir, node.cpus);
    }
  }
  return topology;
}

std::vector<RankBinding> plan_numa_binding(
    const Topology& topology,
    NumaBinding binding,
    int local_world_size,
    const std::vector<int>& allowed_cpus) {
  if (binding == NumaBinding::kNone) {
    return {};
  }
  const std::string flag = std::string("--numa-binding=") + to_string(binding);
  if (local_world_size < 1) {
    throw InvalidArgument(
        flag + ": need at least one local rank, got " +
        std::to_string(local_world_size));
  }
  std::vector<int> allowed = allowed_cpus;
  std::ranges::sort(allowed);
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());

  // The nodes ranks go to: those with a CPU this process may use.
  std::vector<const Topology::Node*> usable;
  std::string all_nodes;
  for (const Topology::Node& node : topology.nodes) {
    if (!intersect(node.cpus, allowed).empty()) {
      usable.push_back(&node);
    }
    all_nodes += (all_nodes.empty() ? "" : "; ") + std::string("node ") +
                 std::to_string(node.id) + ": " +
                 (node.cpus.empty() ? "no CPUs" : format_cpulist(node.cpus));
  }
  if (usable.empty()) {
    throw InvalidArgument(
        flag + ": none of the CPUs this process may use (" +
        format_cpulist(allowed) + ") is on a NUMA node of the topology (" +
        (all_nodes.empty() ? "no nodes" : all_nodes) + ")");
  }

  const size_t n = static_cast<size_t>(local_world_size);
  std::vector<size_t> node_of(n);  // rank -> index into usable
  for (size_t rank = 0; rank < n; ++rank) {
    node_of[rank] = rank * usable.size() / n;
  }

  std::vector<RankBinding> plan(n);
  for (size_t rank = 0; rank < n; ++rank) {
    const Topology::Node& node = *usable[node_of[rank]];
    RankBinding& b = plan[rank];
    b.socket = node.socket;
    if (binding == NumaBinding::kSocket) {
      for (const Topology::Node* other : usable) {
        if (other->socket == node.socket) {
          b.nodes.push_back(other->id);
          b.cpus.insert(b.cpus.end(), other->cpus.begin(), other->cpus.end());
        }
      }
      b.cpus = intersect(b.cpus, allowed);
    } else {
      b.nodes = {node.id};
      b.cpus = intersect(node.cpus, allowed);
    }
    b.mem_nodes = b.nodes;
  }
  if (binding == NumaBinding::kCoreComplex) {
    // The j-th rank on a node gets its j-th core complex (round robin when
    // the node has fewer complexes than ranks); the whole node without
    // cache information.
    std::vector<size_t> on_node(usable.size(), 0);
    for (size_t rank = 0; rank < n; ++rank) {
      const Topology::Node& node = *usable[node_of[rank]];
      std::vector<std::vector<int>> complexes;
      for (const auto& c : node.complexes) {
        if (auto mine = intersect(c, allowed); !mine.empty()) {
          complexes.push_back(std::move(mine));
        }
      }
      size_t j = on_node[node_of[rank]]++;
      if (!complexes.empty()) {
        plan[rank].cpus = complexes[j % complexes.size()];
      }
    }
    return plan;
  }
  if (binding != NumaBinding::kExclusive) {
    return plan;
  }

  // Exclusive: each node's allowed CPUs, as whole cores where there are
  // enough, cut into one contiguous share per rank on the node.
  for (size_t k = 0; k < usable.size(); ++k) {
    std::vector<int> ranks;
    for (size_t rank = 0; rank < n; ++rank) {
      if (node_of[rank] == k) {
        ranks.push_back(static_cast<int>(rank));
      }
    }
    if (ranks.empty()) {
      continue;
    }
    const Topology::Node& node = *usable[k];
    const std::vector<int> cpus = intersect(node.cpus, allowed);
    std::vector<std::vector<int>> units;
    for (const std::vector<int>& core : node.cores) {
      if (auto mine = intersect(core, allowed); !mine.empty()) {
        units.push_back(std::move(mine));
      }
    }
    if (units.size() < ranks.size()) {
      // No core information, or fewer cores than ranks: single CPUs.
      units.clear();
      for (int cpu : cpus) {
        units.push_back({cpu});
      }
    }
    if (units.size() < ranks.size()) {
      throw InvalidArgument(
          flag + ": NUMA node " + std::to_string(node.id) + " has " +
          std::to_string(cpus.size()) + " usable " +
          plural(cpus.size(), "CPU", "CPUs") + " (" + format_cpulist(cpus) +
          ") for " + std::to_string(ranks.size()) + " local ranks (" +
          format_cpulist(ranks) +
          "); run fewer workers per node or use --numa-binding=node");
    }
    const size_t m = ranks.size();
    for (size_t j = 0; j < m; ++j) {
      std::vector<int>& share = plan[static_cast<size_t>(ranks[j])].cpus;
      share.clear();
      for (size_t u = j * units.size() / m; u < (j + 1) * units.size() / m;
           ++u) {
        share.insert(share.end(), units[u].begin(), units[u].end());
      }
      std::ranges::sort(share);
    }
  }
  return plan;
}

std::vector<int> restrict_memory_nodes(
    std::vector<RankBinding>& plan, const std::vector<int>& allowed) {
  std::vector<int> sorted = allowed;
  std::ranges::sort(sorted);
  std::vector<int> unbound;
  for (size_t rank = 0; rank < plan.size(); ++rank) {
    std::vector<int>& mems = plan[rank].mem_nodes;
    std::vector<int> kept = intersect(mems, sorted);
    if (kept.empty() && !mems.empty()) {
      unbound.push_back(static_cast<int>(rank));
    }
    mems = std::move(kept);
  }
  return unbound;
}

std::string describe(const RankBinding& binding) {
  std::string out = binding.nodes.size() == 1 ? "NUMA node " : "NUMA nodes ";
  out += format_cpulist(binding.nodes);
  if (binding.nodes.size() > 1) {
    out += " (socket " + std::to_string(binding.socket) + ")";
  }
  out += ", CPUs " + format_cpulist(binding.cpus);
  if (binding.mem_nodes.empty()) {
    out += ", memory not bound";
  } else {
    out += binding.mem_nodes.size() == 1 ? ", memory on node "
                                         : ", memory on nodes ";
    out += format_cpulist(binding.mem_nodes);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> numa_env(
    NumaBinding binding, const RankBinding& rank) {
  return {
      {"TIDE_NUMA_BINDING", to_string(binding)},
      {"TIDE_NUMA_NODES", format_cpulist(rank.nodes)},
      {"TIDE_CPU_AFFINITY", format_cpulist(rank.cpus)},
      {"TIDE_MEMORY_NODES", format_cpulist(rank.mem_nodes)},
  };
}

std::vector<int> current_affinity() {
  // A mask big enough for the kernel's nr_cpu_ids, found by doubling: the
  // call fails with EINVAL while it is too small.
  for (size_t bits = CPU_SETSIZE; bits <= static_cast<size_t>(kMaxId);
       bits *= 2) {
    std::vector<unsigned long> mask(bits / kWordBits, 0);
    if (::sched_getaffinity(
            0,
            mask.size() * sizeof(unsigned long),
            reinterpret_cast<cpu_set_t*>(mask.data())) == 0) {
      std::vector<int> cpus;
      for (size_t cpu = 0; cpu < bits; ++cpu) {
        if ((mask[cpu / kWordBits] >> (cpu % kWordBits)) & 1UL) {
          cpus.push_back(static_cast<int>(cpu));
        }
      }
      return cpus;
    }
    if (errno != EINVAL) {
      break;
    }
  }
  throw Error(std::string("sched_getaffinity failed: ") + std::strerror(errno));
}

std::vector<int> memory_nodes_allowed() {
  // As for the CPUs: EINVAL while the mask has fewer bits than the kernel
  // has nodes.
  for (size_t bits = 1024; bits <= static_cast<size_t>(kMaxId); bits *= 2) {
    std::vector<unsigned long> mask(bits / kWordBits, 0);
    int mode = 0;
    if (::syscall(
            SYS_get_mempolicy,
            &mode,
            mask.data(),
            bits,
            nullptr,
            MPOL_F_MEMS_ALLOWED) == 0) {
      std::vector<int> nodes;
      for (size_t node = 0; node < bits; ++node) {
        if ((mask[node / kWordBits] >> (node % kWordBits)) & 1UL) {
          nodes.push_back(static_cast<int>(node));
        }
      }
      return nodes;
    }
    if (errno != EINVAL) {
      break;
    }
  }
  return {};
}

namespace detail {

std::vector<RankBinding> plan_numa(const WorkerSpec& spec) {
  std::vector<RankBinding> numa;
  if (spec.numa_binding != NumaBinding::kNone) {
    numa = plan_numa_binding(
        read_topology(spec.topology_root),
        spec.numa_binding,
        spec.local_world_size,
        current_affinity());
    std::vector<int> mems = memory_nodes_allowed();
    if (auto unbound = restrict_memory_nodes(numa, mems); !unbound.empty()) {
      TIDE_LOG_WARN(
          "[{}] --numa-binding={}: memory of local rank(s) {} is not bound "
          "(their CPUs are): the kernel lets this process allocate on "
          "node(s) {} only",
          spec.role,
          to_string(spec.numa_binding),
          format_cpulist(unbound),
          mems.empty() ? std::string("<unknown>") : format_cpulist(mems));
    }
  }
  return numa;
}

}  // namespace detail

}  // namespace tide::agent
