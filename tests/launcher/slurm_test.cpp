// Slurm's host lists and srun's variables, as tiderun reads them.
#include "tide/launcher/slurm.h"

#include <map>

#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::launcher {
namespace {

using Names = std::vector<std::string>;

TEST(HostlistTest, ExpandsAsScontrolShowHostnamesDoes) {
  EXPECT_EQ(expand_hostlist("node01"), Names({"node01"}));
  EXPECT_EQ(
      expand_hostlist("node[01-04,07]"),
      Names({"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(
      expand_hostlist("a[1-2],b,c[9-11]"),
      Names({"a1", "a2", "b", "c9", "c10", "c11"}));
  // The first bound's width is the padding, also past a power of ten.
  EXPECT_EQ(
      expand_hostlist("gpu[098-101]"),
      Names({"gpu098", "gpu099", "gpu100", "gpu101"}));
  // Text after the brackets, and several bracketed parts in one name.
  EXPECT_EQ(
      expand_hostlist("rack[1-2]-node[1-2].ib"),
      Names(
          {"rack1-node1.ib",
           "rack1-node2.ib",
           "rack2-node1.ib",
           "rack2-node2.ib"}));
  EXPECT_EQ(expand_hostlist("n[5]"), Names({"n5"}));
  EXPECT_EQ(expand_hostlist("n[0-0]"), Names({"n0"}));
  EXPECT_EQ(expand_hostlist(""), Names());
  EXPECT_EQ(expand_hostlist("x-1,y[3,1]"), Names({"x-1", "y3", "y1"}));
}

TEST(HostlistTest, RefusesMalformedListsNamingThem) {
  for (const char* bad :
       {"node[1-3",
        "node]1",
        "node[3-1]",
        "node[a-b]",
        "node[1-]",
        "node[[1]]",
        "node[-1]",
        "[]",
        "n[0-9999999]"}) {
    try {
      expand_hostlist(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::string("\"") + bad + "\""),
          std::string::npos)
          << e.what();
    }
  }
}

// srun's variables, as it sets them for a task of a 4-node job.
std::map<std::string, std::string> srun_env() {
  return {
      {"SLURM_JOB_ID", "4242"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_NODEID", "2"},
      {"SLURM_PROCID", "2"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_JOB_NODELIST", "trn[07-09],trn12"},
      {"SLURM_JOB_NUM_NODES", "4"},
      {"SLURM_TASKS_PER_NODE", "1(x4)"},
  };
}

std::optional<SlurmStep> step_of(
    const std::map<std::string, std::string>& env) {
  return slurm_step([&](const char* var) -> const char* {
    auto it = env.find(var);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(SlurmStepTest, ReadsSrunsVariables) {
  auto step = step_of(srun_env());
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->job_id, "4242");
  EXPECT_EQ(step->num_nodes, 4);
  EXPECT_EQ(step->node_id, 2);
  EXPECT_EQ(step->tasks_on_node, 1);
  EXPECT_EQ(step->nodes, Names({"trn07", "trn08", "trn09", "trn12"}));
}

TEST(SlurmStepTest, OutsideAStepThereIsNone) {
  EXPECT_FALSE(step_of({}).has_value());
  // A batch script's own shell: a job, but no step.
  auto batch = srun_env();
  batch.erase("SLURM_STEP_ID");
  EXPECT_FALSE(step_of(batch).has_value());
}

TEST(SlurmStepTest, TasksOnThisNodeComeFromTheCompressedList) {
  auto env = srun_env();
  env["SLURM_TASKS_PER_NODE"] = "1(x2),8,1";
  EXPECT_EQ(step_of(env)->tasks_on_node, 8);  // node 2
  env["SLURM_NTASKS_PER_NODE"] = "3";
  EXPECT_EQ(step_of(env)->tasks_on_node, 3);
}

TEST(SlurmStepTest, MalformedVariablesAreNamed) {
  auto env = srun_env();
  env["SLURM_NODEID"] = "two";
  EXPECT_THROW(
      {
        try {
          step_of(env);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(
              std::string(e.what()).find("SLURM_NODEID"), std::string::npos);
          throw;
        }
      },
      InvalidArgument);
  env = srun_env();
  env["SLURM_NODEID"] = "4";
  EXPECT_THROW(step_of(env), InvalidArgument);
  env = srun_env();
  env["SLURM_JOB_NODELIST"] = "trn[07-";
  EXPECT_THROW(step_of(env), InvalidArgument);
}

}  // namespace
}  // namespace tide::launcher
