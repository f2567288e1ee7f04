// --numa-binding: the topology read from fake sysfs trees, the plan for each
// mode, the binding applied between fork and exec, and tiderun's workers
// reading their own affinity and memory policy back from /proc.
#include "tide/agent/numa.h"

#include <poll.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "agent/janitor.h"
#include "agent/worker_process.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide::agent {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

using test::read_whole;

// A sysfs tree under a temporary directory.
class FakeSysfs {
 public:
  const fs::path& root() const {
    return root_;
  }
  FakeSysfs& node(int id, const std::string& cpulist) {
    write_file(
        root_ / "devices/system/node" / ("node" + std::to_string(id)) /
            "cpulist",
        cpulist + "\n");
    return *this;
  }
  FakeSysfs& cpu(int id, int socket, const std::string& siblings = "") {
    fs::path topo = root_ / "devices/system/cpu" /
                    ("cpu" + std::to_string(id)) / "topology";
    write_file(topo / "physical_package_id", std::to_string(socket) + "\n");
    if (!siblings.empty()) {
      write_file(topo / "thread_siblings_list", siblings + "\n");
    }
    return *this;
  }
  // CPU `id`'s cache `index`: its type ("Unified", "Data", ...), level
  // and the CPUs sharing it.
  FakeSysfs& cache(
      int id,
      int index,
      const std::string& type,
      int level,
      const std::string& shared) {
    fs::path dir = root_ / "devices/system/cpu" / ("cpu" + std::to_string(id)) /
                   "cache" / ("index" + std::to_string(index));
    write_file(dir / "type", type + "\n");
    write_file(dir / "level", std::to_string(level) + "\n");
    write_file(dir / "shared_cpu_list", shared + "\n");
    return *this;
  }
  FakeSysfs& online(const std::string& cpulist) {
    write_file(root_ / "devices/system/cpu/online", cpulist + "\n");
    return *this;
  }

 private:
  test::TempDir tmp_{"tide_sysfs_"};
  const fs::path root_ = tmp_.path();
};

// Two sockets, one node each, four cores of two hyperthreads per socket,
// numbered as Linux numbers them: the siblings of CPU c (c < 8) are c and
// c + 8, so node 0 holds 0-3,8-11.
void make_two_sockets(FakeSysfs& sys) {
  sys.online("0-15").node(0, "0-3,8-11").node(1, "4-7,12-15");
  for (int c = 0; c < 8; ++c) {
    std::string siblings = std::to_string(c) + "," + std::to_string(c + 8);
    sys.cpu(c, c < 4 ? 0 : 1, siblings).cpu(c + 8, c < 4 ? 0 : 1, siblings);
  }
}

// Two sockets of two nodes of four CPUs (no hyperthread information), and
// node 4: memory without CPUs (CXL).
void make_four_nodes(FakeSysfs& sys) {
  for (int n = 0; n < 4; ++n) {
    sys.node(n, std::to_string(4 * n) + "-" + std::to_string(4 * n + 3));
  }
  sys.node(4, "");
  for (int c = 0; c < 16; ++c) {
    sys.cpu(c, c < 8 ? 0 : 1);
  }
}

std::vector<int> range(int lo, int hi) {
  std::vector<int> out;
  for (int i = lo; i <= hi; ++i) {
    out.push_back(i);
  }
  return out;
}

// Each rank's CPUs, as cpulists.
std::vector<std::string> cpus_of(const std::vector<RankBinding>& plan) {
  std::vector<std::string> out;
  for (const RankBinding& b : plan) {
    out.push_back(format_cpulist(b.cpus));
  }
  return out;
}

std::vector<int> nodes_of(const std::vector<RankBinding>& plan) {
  std::vector<int> out;
  for (const RankBinding& b : plan) {
    EXPECT_EQ(b.nodes.size(), 1u);
    out.push_back(b.nodes.front());
  }
  return out;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

using Strings = std::vector<std::string>;
using Ints = std::vector<int>;

TEST(NumaCpulistTest, ParsesAndFormatsTheLinuxFormat) {
  EXPECT_EQ(parse_cpulist("0-3,8-11\n"), (Ints{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(parse_cpulist("5"), (Ints{5}));
  EXPECT_EQ(parse_cpulist("3,1-2,2"), (Ints{1, 2, 3}));
  EXPECT_EQ(parse_cpulist(" \n"), Ints{});
  EXPECT_EQ(format_cpulist({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(format_cpulist({9, 0, 1, 8}), "0-1,8-9");
  EXPECT_EQ(format_cpulist({}), "");
  for (const char* bad : {"1-", "3-1", "a", "1,,2", "-1", "0-99999999"}) {
    EXPECT_THROW(parse_cpulist(bad), InvalidArgument) << bad;
  }
}

TEST(NumaBindingTest, ParsesTheModesAndNamesThemOnABadOne) {
  EXPECT_EQ(parse_numa_binding("none"), NumaBinding::kNone);
  EXPECT_EQ(parse_numa_binding("node"), NumaBinding::kNode);
  EXPECT_EQ(parse_numa_binding("socket"), NumaBinding::kSocket);
  EXPECT_EQ(parse_numa_binding("exclusive"), NumaBinding::kExclusive);
  EXPECT_EQ(parse_numa_binding("core-complex"), NumaBinding::kCoreComplex);
  EXPECT_STREQ(to_string(NumaBinding::kExclusive), "exclusive");
  EXPECT_STREQ(to_string(NumaBinding::kCoreComplex), "core-complex");
  EXPECT_EQ(
      error_of([] { parse_numa_binding("bogus"); }),
      "--numa-binding=bogus: expected none, node, socket, exclusive or "
      "core-complex");
}

TEST(NumaTopologyTest, ReadsTwoSocketsWithTheirHyperthreads) {
  FakeSysfs sys;
  make_two_sockets(sys);
  Topology t = read_topology(sys.root().string());
  ASSERT_EQ(t.nodes.size(), 2u);
  EXPECT_EQ(t.nodes[0].id, 0);
  EXPECT_EQ(t.nodes[0].socket, 0);
  EXPECT_EQ(t.nodes[0].cpus, (Ints{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(
      t.nodes[0].cores, (std::vector<Ints>{{0, 8}, {1, 9}, {2, 10}, {3, 11}}));
  EXPECT_EQ(t.nodes[1].id, 1);
  EXPECT_EQ(t.nodes[1].socket, 1);
  EXPECT_EQ(format_cpulist(t.nodes[1].cpus), "4-7,12-15");
}

TEST(NumaTopologyTest, ReadsFourNodesOnTwoSocketsAndAMemoryOnlyNode) {
  FakeSysfs sys;
  make_four_nodes(sys);
  Topology t = read_topology(sys.root().string());
  ASSERT_EQ(t.nodes.size(), 5u);
  std::vector<int> sockets;
  for (const auto& n : t.nodes) {
    sockets.push_back(n.socket);
  }
  EXPECT_EQ(sockets, (Ints{0, 0, 1, 1, -1}));
  EXPECT_EQ(t.nodes[2].cpus, range(8, 11));
  EXPECT_TRUE(t.nodes[2].cores.empty());  // no thread_siblings_list
  EXPECT_TRUE(t.nodes[4].cpus.empty());
}

TEST(NumaTopologyTest, OfflineCpusAreLeftOut) {
  FakeSysfs sys;
  make_two_sockets(sys);
  sys.online("0-14");
  Topology t = read_topology(sys.root().string());
  EXPECT_EQ(format_cpulist(t.nodes[1].cpus), "4-7,12-14");
}

TEST(NumaTopologyTest, WithoutNumaIsOneNodeOfEveryOnlineCpu) {
  FakeSysfs sys;
  sys.online("0-3").cpu(0, 0).cpu(1, 0).cpu(2, 0).cpu(3, 0);
  Topology t = read_topology(sys.root().string());
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].id, 0);
  EXPECT_EQ(t.nodes[0].socket, 0);
  EXPECT_EQ(t.nodes[0].cpus, range(0, 3));
}

TEST(NumaTopologyTest, AMalformedOrMissingFileIsAnErrorNamingIt) {
  {
    FakeSysfs sys;
    make_two_sockets(sys);
    sys.node(1, "4-x");
    std::string e = error_of([&] { read_topology(sys.root().string()); });
    EXPECT_NE(
        e.find(
            "malformed " + sys.root().string() +
            "/devices/system/node/node1/cpulist"),
        std::string::npos)
        << e;
    EXPECT_NE(e.find("\"4-x\" is not a cpulist"), std::string::npos) << e;
  }
  {
    FakeSysfs sys;
    make_two_sockets(sys);
    write_file(
        sys.root() / "devices/system/cpu/cpu4/topology/physical_package_id",
        "socket one\n");
    std::string e = error_of([&] { read_topology(sys.root().string()); });
    EXPECT_NE(e.find("cpu4/topology/physical_package_id"), std::string::npos)
        << e;
    EXPECT_NE(e.find("\"socket one\""), std::string::npos) << e;
  }
  {
    FakeSysfs sys;
    sys.node(0, "0-1");  // and no cpu0/topology
    std::string e = error_of([&] { read_topology(sys.root().string()); });
    EXPECT_NE(
        e.find(
            "cannot read " + sys.root().string() +
            "/devices/system/cpu/cpu0/topology/physical_package_id"),
        std::string::npos)
        << e;
  }
  {
    FakeSysfs sys;  // nothing at all
    std::string e = error_of([&] { read_topology(sys.root().string()); });
    EXPECT_NE(e.find("cannot read the CPU topology under"), std::string::npos)
        << e;
  }
}

class NumaPlanTest : public ::testing::Test {
 protected:
  NumaPlanTest() {
    make_two_sockets(two_sockets_sys_);
    make_four_nodes(four_nodes_sys_);
    two_sockets_ = read_topology(two_sockets_sys_.root().string());
    four_nodes_ = read_topology(four_nodes_sys_.root().string());
  }

  FakeSysfs two_sockets_sys_;
  FakeSysfs four_nodes_sys_;
  Topology two_sockets_;
  Topology four_nodes_;
  const Ints all_ = range(0, 15);
};

TEST_F(NumaPlanTest, NodeGivesNeighbouringRanksTheSameNode) {
  auto plan = plan_numa_binding(two_sockets_, NumaBinding::kNode, 2, all_);
  EXPECT_EQ(cpus_of(plan), (Strings{"0-3,8-11", "4-7,12-15"}));
  EXPECT_EQ(plan[0].mem_nodes, Ints{0});
  EXPECT_EQ(plan[1].mem_nodes, Ints{1});
  EXPECT_EQ(plan[1].socket, 1);

  EXPECT_EQ(
      nodes_of(plan_numa_binding(four_nodes_, NumaBinding::kNode, 4, all_)),
      (Ints{0, 1, 2, 3}));
  EXPECT_EQ(
      nodes_of(plan_numa_binding(four_nodes_, NumaBinding::kNode, 8, all_)),
      (Ints{0, 0, 1, 1, 2, 2, 3, 3}));
  // Uneven: rank i goes to node i * 4 / 3; fewer ranks than nodes spread.
  EXPECT_EQ(
      nodes_of(plan_numa_binding(four_nodes_, NumaBinding::kNode, 3, all_)),
      (Ints{0, 1, 2}));
  EXPECT_EQ(
      nodes_of(plan_numa_binding(four_nodes_, NumaBinding::kNode, 2, all_)),
      (Ints{0, 2}));
  EXPECT_EQ(
      nodes_of(plan_numa_binding(two_sockets_, NumaBinding::kNode, 3, all_)),
      (Ints{0, 0, 1}));
  // The memory-only node 4 takes no rank.
  EXPECT_EQ(
      nodes_of(plan_numa_binding(four_nodes_, NumaBinding::kNode, 5, all_)),
      (Ints{0, 0, 1, 2, 3}));
}

// One node of 12 CPUs in three core complexes: CPUs 0-3 and 4-7 share an
// L3 each, 8-11 another one but only 8-9 are described as sharing (so the
// complexes are 0-3, 4-7, 8-9 and the lone 10 and 11). L1 data and L2
// caches are private and must not decide.
TEST(NumaCoreComplexTest, EachRankOnANodeGetsOneLastLevelCacheGroup) {
  FakeSysfs sys;
  sys.online("0-11").node(0, "0-11");
  for (int c = 0; c < 12; ++c) {
    std::string l3 = c < 4 ? "0-3" : c < 8 ? "4-7" : c < 10 ? "8-9" : "";
    sys.cpu(c, 0)
        .cache(c, 0, "Data", 1, std::to_string(c))
        .cache(c, 1, "Instruction", 1, std::to_string(c))
        .cache(c, 2, "Unified", 2, std::to_string(c));
    if (!l3.empty()) {
      sys.cache(c, 3, "Unified", 3, l3);
    }
  }
  Topology t = read_topology(sys.root().string());
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(
      t.nodes[0].complexes,
      (std::vector<Ints>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}, {10}, {11}}));
  auto plan = plan_numa_binding(t, NumaBinding::kCoreComplex, 3, range(0, 11));
  EXPECT_EQ(cpus_of(plan), (Strings{"0-3", "4-7", "8-9"}));
  EXPECT_EQ(plan[2].mem_nodes, Ints{0});
  // More ranks than complexes: round robin.
  plan = plan_numa_binding(t, NumaBinding::kCoreComplex, 6, range(0, 11));
  EXPECT_EQ(cpus_of(plan), (Strings{"0-3", "4-7", "8-9", "10", "11", "0-3"}));
  // Only the allowed CPUs of a complex; a complex with none is skipped.
  plan =
      plan_numa_binding(t, NumaBinding::kCoreComplex, 2, Ints{2, 3, 8, 9, 10});
  EXPECT_EQ(cpus_of(plan), (Strings{"2-3", "8-9"}));
}

TEST_F(NumaPlanTest, CoreComplexWithoutCacheInformationIsTheNode) {
  auto plan =
      plan_numa_binding(two_sockets_, NumaBinding::kCoreComplex, 2, all_);
  EXPECT_EQ(cpus_of(plan), (Strings{"0-3,8-11", "4-7,12-15"}));
}

TEST_F(NumaPlanTest, SocketGivesEveryNodeOfTheRanksSocket) {
  auto plan = plan_numa_binding(four_nodes_, NumaBinding::kSocket, 4, all_);
  EXPECT_EQ(cpus_of(plan), (Strings{"0-7", "0-7", "8-15", "8-15"}));
  for (int r : {0, 1}) {
    EXPECT_EQ(plan[r].nodes, (Ints{0, 1}));
    EXPECT_EQ(plan[r].mem_nodes, (Ints{0, 1}));
    EXPECT_EQ(plan[r].socket, 0);
  }
  EXPECT_EQ(plan[3].mem_nodes, (Ints{2, 3}));
  EXPECT_EQ(plan[3].socket, 1);
  plan = plan_numa_binding(four_nodes_, NumaBinding::kSocket, 2, all_);
  EXPECT_EQ(cpus_of(plan), (Strings{"0-7", "8-15"}));
  plan = plan_numa_binding(two_sockets_, NumaBinding::kSocket, 8, all_);
  EXPECT_EQ(format_cpulist(plan[3].cpus), "0-3,8-11");
  EXPECT_EQ(format_cpulist(plan[4].cpus), "4-7,12-15");
}

TEST_F(NumaPlanTest, ExclusiveSplitsANodeIntoDisjointSharesOfWholeCores) {
  auto plan = plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 2, all_);
  EXPECT_EQ(cpus_of(plan), (Strings{"0-3,8-11", "4-7,12-15"}));
  plan = plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 4, all_);
  EXPECT_EQ(
      cpus_of(plan),
      (Strings{"0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"}));
  EXPECT_EQ(plan[1].mem_nodes, Ints{0});
  EXPECT_EQ(plan[2].mem_nodes, Ints{1});
  plan = plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 8, all_);
  EXPECT_EQ(cpus_of(plan)[0], "0,8");  // one core, both its threads
  EXPECT_EQ(cpus_of(plan)[7], "7,15");
  // Uneven: two ranks share node 0, one has node 1.
  plan = plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 3, all_);
  EXPECT_EQ(cpus_of(plan), (Strings{"0-1,8-9", "2-3,10-11", "4-7,12-15"}));
  // More ranks than cores: single CPUs.
  plan = plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 16, all_);
  EXPECT_EQ(cpus_of(plan)[0], "0");
  EXPECT_EQ(cpus_of(plan)[4], "8");
  // Without core information, contiguous CPUs; shares differ by at most one.
  plan = plan_numa_binding(four_nodes_, NumaBinding::kExclusive, 8, all_);
  EXPECT_EQ(cpus_of(plan)[0], "0-1");
  EXPECT_EQ(cpus_of(plan)[7], "14-15");
  plan = plan_numa_binding(four_nodes_, NumaBinding::kExclusive, 12, all_);
  EXPECT_EQ(
      (Strings{cpus_of(plan)[0], cpus_of(plan)[1], cpus_of(plan)[2]}),
      (Strings{"0", "1", "2-3"}));
  // Every plan: disjoint shares, nothing outside the rank's node.
  for (int nproc : {2, 3, 4, 5, 8, 13, 16}) {
    plan = plan_numa_binding(four_nodes_, NumaBinding::kExclusive, nproc, all_);
    std::map<int, int> owner;
    for (int r = 0; r < nproc; ++r) {
      ASSERT_FALSE(plan[r].cpus.empty()) << nproc << " " << r;
      for (int c : plan[r].cpus) {
        EXPECT_TRUE(owner.emplace(c, r).second)
            << "CPU " << c << " given to ranks " << owner[c] << " and " << r;
        EXPECT_EQ(c / 4, plan[r].nodes.front());
      }
    }
  }
}

TEST_F(NumaPlanTest, ExclusiveWithMoreRanksThanCpusOnANodeSaysSo) {
  std::string e = error_of([&] {
    plan_numa_binding(four_nodes_, NumaBinding::kExclusive, 20, all_);
  });
  EXPECT_EQ(
      e,
      "--numa-binding=exclusive: NUMA node 0 has 4 usable CPUs (0-3) for 5 "
      "local ranks (0-4); run fewer workers per node or use "
      "--numa-binding=node");
  EXPECT_THROW(
      plan_numa_binding(four_nodes_, NumaBinding::kExclusive, 20, all_),
      InvalidArgument);
}

TEST_F(NumaPlanTest, OnlyAllowedCpusAreGivenAndNodesWithoutAnyTakeNoRank) {
  // A cpuset within node 0: both ranks there.
  auto plan =
      plan_numa_binding(two_sockets_, NumaBinding::kNode, 2, {0, 1, 2, 3});
  EXPECT_EQ(cpus_of(plan), (Strings{"0-3", "0-3"}));
  EXPECT_EQ(nodes_of(plan), (Ints{0, 0}));
  plan =
      plan_numa_binding(two_sockets_, NumaBinding::kNode, 2, {2, 3, 4, 5, 12});
  EXPECT_EQ(cpus_of(plan), (Strings{"2-3", "4-5,12"}));
  plan = plan_numa_binding(four_nodes_, NumaBinding::kSocket, 3, {1, 6, 9});
  EXPECT_EQ(cpus_of(plan), (Strings{"1,6", "1,6", "9"}));
  // Exclusive keeps what is left of each core together.
  plan = plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 2, {0, 8, 1});
  EXPECT_EQ(cpus_of(plan), (Strings{"0,8", "1"}));
  EXPECT_THROW(
      plan_numa_binding(two_sockets_, NumaBinding::kExclusive, 3, {0, 8}),
      InvalidArgument);

  std::string e = error_of([&] {
    plan_numa_binding(two_sockets_, NumaBinding::kNode, 2, {16, 17});
  });
  EXPECT_NE(
      e.find("--numa-binding=node: none of the CPUs this process may use "
             "(16-17) is on a NUMA node"),
      std::string::npos)
      << e;
}

TEST_F(NumaPlanTest, NoneIsAnEmptyPlanAndNoRanksIsAnError) {
  EXPECT_TRUE(
      plan_numa_binding(four_nodes_, NumaBinding::kNone, 4, all_).empty());
  EXPECT_THROW(
      plan_numa_binding(four_nodes_, NumaBinding::kNode, 0, all_),
      InvalidArgument);
}

TEST_F(NumaPlanTest, MemoryNodesTheKernelLacksAreDroppedAndSaidInWords) {
  auto plan = plan_numa_binding(two_sockets_, NumaBinding::kNode, 2, all_);
  EXPECT_EQ(describe(plan[0]), "NUMA node 0, CPUs 0-3,8-11, memory on node 0");
  EXPECT_EQ(restrict_memory_nodes(plan, {0}), Ints{1});
  EXPECT_EQ(plan[0].mem_nodes, Ints{0});
  EXPECT_TRUE(plan[1].mem_nodes.empty());
  EXPECT_EQ(describe(plan[1]), "NUMA node 1, CPUs 4-7,12-15, memory not bound");
  auto env = numa_env(NumaBinding::kNode, plan[1]);
  EXPECT_EQ(
      env,
      (std::vector<std::pair<std::string, std::string>>{
          {"TIDE_NUMA_BINDING", "node"},
          {"TIDE_NUMA_NODES", "1"},
          {"TIDE_CPU_AFFINITY", "4-7,12-15"},
          {"TIDE_MEMORY_NODES", ""}}));

  plan = plan_numa_binding(four_nodes_, NumaBinding::kSocket, 4, all_);
  EXPECT_EQ(restrict_memory_nodes(plan, {0, 2}), Ints{});
  EXPECT_EQ(plan[0].mem_nodes, Ints{0});
  EXPECT_EQ(
      describe(plan[3]),
      "NUMA nodes 2-3 (socket 1), CPUs 8-15, memory on node 2");
}

// What /proc/self/status says of this process.
std::string status_field(const std::string& name) {
  std::istringstream in(read_whole("/proc/self/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) == 0) {
      return line.substr(line.find_first_not_of(" \t", name.size() + 1));
    }
  }
  return "";
}

TEST(NumaThisMachineTest, AffinityAndMemoryNodesMatchProc) {
  EXPECT_EQ(
      format_cpulist(current_affinity()), status_field("Cpus_allowed_list"));
  auto mems = memory_nodes_allowed();
  if (!mems.empty()) {
    EXPECT_EQ(format_cpulist(mems), status_field("Mems_allowed_list"));
  }
}

// The binding as the child applies it, below the agent.
class NumaWorkerProcessTest : public ::testing::Test {
 protected:
  // Runs `script` under sh with `binding`; returns (exit code, stdout,
  // stderr).
  std::tuple<int, std::string, std::string> run(
      const std::string& script, detail::Binding binding) {
    detail::LaunchSpec ls;
    ls.env = {"PATH=/usr/bin:/bin"};
    ls.path = "/bin/sh";
    ls.argv = {"sh", "-c", script};
    ls.out = {
        .mode = detail::StreamTarget::Mode::kFile,
        .path = (dir_ / "out.log").string()};
    ls.err = {
        .mode = detail::StreamTarget::Mode::kFile,
        .path = (dir_ / "err.log").string()};
    ls.binding = std::move(binding);
    fs::remove(dir_ / "out.log");
    fs::remove(dir_ / "err.log");
    detail::WorkerProcess p(ls, &janitor_);
    pollfd pfd{.fd = p.pidfd(), .events = POLLIN, .revents = 0};
    EXPECT_EQ(::poll(&pfd, 1, 30'000), 1) << "the worker did not exit";
    EXPECT_TRUE(p.poll_exit());
    return {
        p.exited() ? p.exitcode() : -1,
        read_whole(dir_ / "out.log"),
        read_whole(dir_ / "err.log")};
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  detail::Janitor janitor_;
};

TEST_F(NumaWorkerProcessTest, TheChildIsBoundBeforeExec) {
  Ints allowed = current_affinity();
  Ints mems = memory_nodes_allowed();
  if (mems.empty() || !fs::exists("/proc/self/numa_maps")) {
    GTEST_SKIP() << "this kernel has no NUMA memory policy to check";
  }
  int cpu = allowed.back();
  auto [code, out, err] =
      run("grep Cpus_allowed_list /proc/$$/status; "
          "grep -m1 -o 'bind:[0-9,-]*' /proc/$$/numa_maps",
          detail::Binding::make({cpu}, {mems.front()}));
  EXPECT_EQ(code, 0) << err;
  EXPECT_EQ(
      out,
      "Cpus_allowed_list:\t" + std::to_string(cpu) +
          "\nbind:" + std::to_string(mems.front()) + "\n");
}

TEST_F(NumaWorkerProcessTest, AFailedBindingEndsTheChildAsAFailedExecDoes) {
  // CPU 4000 is beyond this kernel's CPUs: sched_setaffinity gets an empty
  // mask.
  auto [code, out, err] = run("echo ran", detail::Binding::make({4000}, {}));
  EXPECT_EQ(code, 127);
  EXPECT_EQ(out, "");
  EXPECT_EQ(
      err,
      "tide: cannot bind the worker to CPUs 4000 (--numa-binding): Invalid "
      "argument\n");
  // Node 1000 is beyond the kernel's nodes.
  std::tie(code, out, err) = run(
      "echo ran", detail::Binding::make({current_affinity().front()}, {1000}));
  EXPECT_EQ(code, 127);
  EXPECT_NE(
      err.find("tide: cannot bind the worker to memory nodes 1000"),
      std::string::npos)
      << err;
}

// tiderun as a user runs it, each worker reading its binding back from
// /proc/<its pid>.
class NumaTiderunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    allowed_ = current_affinity();
    if (allowed_.size() < 2) {
      GTEST_SKIP() << "needs 2 allowed CPUs, this process has "
                   << format_cpulist(allowed_);
    }
    script_ = (dir_ / "w.sh").string();
    std::ofstream(script_)
        << "#!/bin/sh\n"
           "touch \"$(dirname \"$0\")/ran\"\n"
           "cpus=$(grep Cpus_allowed_list /proc/$$/status | cut -f2)\n"
           "mems=$(grep Mems_allowed_list /proc/$$/status | cut -f2)\n"
           "policy=$(grep -m1 -o 'bind:[0-9,-]*' /proc/$$/numa_maps "
           "2>/dev/null || echo none)\n"
           "echo \"rank=$LOCAL_RANK cpus=$cpus mems=$mems policy=$policy "
           "mode=$TIDE_NUMA_BINDING nodes=$TIDE_NUMA_NODES "
           "affinity=$TIDE_CPU_AFFINITY memory=$TIDE_MEMORY_NODES end\"\n";
    fs::permissions(script_, fs::perms::owner_all);
  }

  // Runs to the end; returns (exit code, output).
  std::pair<int, std::string> run(
      std::vector<std::string> args,
      std::vector<std::pair<std::string, std::string>> env = {}) {
    args.insert(
        args.begin(), {TIDERUN_BIN, "--log-dir", (dir_ / "logs").string()});
    test::Subprocess p(args, {.env = std::move(env), .merge_stderr = true});
    std::string out = p.read_all(60s);
    auto status = p.wait(30s);
    EXPECT_TRUE(status.has_value()) << out;
    return {
        status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1,
        std::move(out)};
  }

  // Each rank's "key=value" words from its line of output.
  static std::map<int, std::map<std::string, std::string>> reports(
      const std::string& out) {
    std::map<int, std::map<std::string, std::string>> by_rank;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      auto at = line.find("rank=");
      if (at == std::string::npos || line.find(" end") == std::string::npos) {
        continue;
      }
      std::map<std::string, std::string> words;
      std::istringstream ws(line.substr(at));
      for (std::string w; ws >> w;) {
        auto eq = w.find('=');
        if (eq != std::string::npos) {
          words[w.substr(0, eq)] = w.substr(eq + 1);
        }
      }
      by_rank[std::stoi(words["rank"])] = words;
    }
    return by_rank;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  Ints allowed_;
  std::string script_;
};

TEST_F(NumaTiderunTest, ExclusiveGivesEachRankItsOwnCpusOfThisMachine) {
  auto plan =
      plan_numa_binding(read_topology(), NumaBinding::kExclusive, 2, allowed_);
  auto [code, out] = run(
      {"--standalone",
       "--nproc-per-node=2",
       "--numa-binding=exclusive",
       script_});
  ASSERT_EQ(code, 0) << out;
  auto by_rank = reports(out);
  ASSERT_EQ(by_rank.size(), 2u) << out;
  Ints seen;
  for (int r : {0, 1}) {
    auto& w = by_rank[r];
    Ints cpus = parse_cpulist(w["cpus"]);
    EXPECT_EQ(format_cpulist(cpus), format_cpulist(plan[r].cpus)) << out;
    EXPECT_EQ(w["affinity"], w["cpus"]) << out;
    EXPECT_EQ(w["mode"], "exclusive");
    seen.insert(seen.end(), cpus.begin(), cpus.end());
    // The plan's memory node is this kernel's: bound.
    if (fs::exists("/proc/self/numa_maps")) {
      EXPECT_EQ(w["policy"], "bind:" + w["memory"]) << out;
    }
    EXPECT_NE(
        out.find(
            "[default] local rank " + std::to_string(r) +
            ": --numa-binding=exclusive: NUMA node " + w["nodes"] + ", CPUs " +
            w["cpus"] + ", memory on node " + w["memory"]),
        std::string::npos)
        << out;
  }
  std::ranges::sort(seen);
  EXPECT_EQ(std::ranges::adjacent_find(seen), seen.end())
      << "ranks share CPUs: " << out;
  if (allowed_ == Ints{0, 1} && read_topology().nodes.size() == 1) {
    // This project's machine: two CPUs, one node.
    EXPECT_EQ(by_rank[0]["cpus"], "0");
    EXPECT_EQ(by_rank[1]["cpus"], "1");
  }
}

TEST_F(NumaTiderunTest, AFakeTopologyBindsCpusAndSkipsMemoryTheKernelLacks) {
  // Two nodes of one allowed CPU each. The first is a memory node this
  // kernel has; the second is one it lacks.
  Ints mems = memory_nodes_allowed();
  int real = mems.empty() ? 0 : mems.front();
  int fake = mems.empty() ? 1 : mems.back() + 1;
  FakeSysfs sys;
  sys.node(real, std::to_string(allowed_[0]))
      .node(fake, std::to_string(allowed_[1]))
      .cpu(allowed_[0], 0)
      .cpu(allowed_[1], 0);
  auto [code, out] = run(
      {"--standalone", "--nproc-per-node=2", "--numa-binding=node", script_},
      {{"TIDE_TOPOLOGY_ROOT", sys.root().string()}});
  ASSERT_EQ(code, 0) << out;
  auto by_rank = reports(out);
  ASSERT_EQ(by_rank.size(), 2u) << out;
  for (int r : {0, 1}) {
    EXPECT_EQ(by_rank[r]["cpus"], std::to_string(allowed_[r])) << out;
    EXPECT_EQ(by_rank[r]["affinity"], std::to_string(allowed_[r])) << out;
    EXPECT_EQ(by_rank[r]["mode"], "node");
  }
  EXPECT_EQ(by_rank[0]["nodes"], std::to_string(real));
  EXPECT_EQ(by_rank[1]["nodes"], std::to_string(fake));
  EXPECT_EQ(by_rank[1]["memory"], "");
  if (!mems.empty() && fs::exists("/proc/self/numa_maps")) {
    EXPECT_EQ(by_rank[0]["memory"], std::to_string(real));
    EXPECT_EQ(by_rank[0]["policy"], "bind:" + std::to_string(real)) << out;
    EXPECT_EQ(by_rank[1]["policy"], "none") << out;
  }
  EXPECT_NE(
      out.find("memory of local rank(s) 1 is not bound"), std::string::npos)
      << out;
  EXPECT_NE(
      out.find(
          "[default] local rank 1: --numa-binding=node: NUMA node " +
          std::to_string(fake) + ", CPUs " + std::to_string(allowed_[1]) +
          ", memory not bound"),
      std::string::npos)
      << out;
}

TEST_F(NumaTiderunTest, ABadModeOrTopologyStopsTiderunBeforeAnyWorker) {
  auto [code, out] = run({"--standalone", "--numa-binding=bogus", script_});
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(
      out.find("--numa-binding=bogus: expected none, node, socket, exclusive "
               "or core-complex"),
      std::string::npos)
      << out;
  std::tie(code, out) =
      run({"--standalone", script_}, {{"PET_NUMA_BINDING", "bogus"}});
  EXPECT_EQ(code, 2) << out;

  FakeSysfs sys;
  sys.node(0, "0-x");
  std::tie(code, out) =
      run({"--standalone", "--numa-binding=node", script_},
          {{"TIDE_TOPOLOGY_ROOT", sys.root().string()}});
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(
      out.find(
          "malformed " + sys.root().string() +
          "/devices/system/node/node0/cpulist"),
      std::string::npos)
      << out;
  // Exclusive with more ranks than the node has CPUs: a usage error.
  FakeSysfs small;
  small.node(0, std::to_string(allowed_[0])).cpu(allowed_[0], 0);
  std::tie(code, out) =
      run({"--standalone",
           "--nproc-per-node=2",
           "--numa-binding=exclusive",
           script_},
          {{"TIDE_TOPOLOGY_ROOT", small.root().string()}});
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("for 2 local ranks"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "ran")) << "a worker started";
}

}  // namespace
}  // namespace tide::agent
