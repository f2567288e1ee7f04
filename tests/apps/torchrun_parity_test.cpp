// torchrun 2.x's flags and variables under tiderun, each with a real job:
// the virtual local rank, duplicate filters, the line prefix template,
// PET_* precedence, the one-node default port, device counts, torch's
// plugin names. docs/torchrun-parity.md lists them all;
// tests/apps/torchrun_parity_test.py checks that table against --help.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using test::Subprocess;
namespace fs = std::filesystem;

class TorchrunParityTest : public ::testing::Test {
 protected:
  TorchrunParityTest() {
    worker_ = (dir_ / "w.sh").string();
    std::ofstream(worker_) << "#!/bin/sh\n"
                           << "echo \"rank $RANK LOCAL_RANK=$LOCAL_RANK "
                              "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES "
                              "MASTER_PORT=$MASTER_PORT "
                              "SIGNALS=$TORCHELASTIC_SIGNALS_TO_HANDLE\"\n"
                           << "echo \"loss 0.5, step $RANK\"\n"
                           << "echo \"warn: disk, slow\" >&2\n";
    fs::permissions(worker_, fs::perms::owner_all);
  }

  // tiderun ARGS... w.sh with `env` added: (exit code, stdout+stderr).
  std::pair<int, std::string> run(
      std::vector<std::string> args,
      std::vector<std::pair<std::string, std::string>> env = {}) {
    args.insert(args.begin(), {TIDERUN_BIN, "--log-dir", logs().string()});
    args.push_back(worker_);
    Subprocess p(args, {.env = std::move(env), .merge_stderr = true});
    std::string out = p.read_all(60s);
    auto status = p.wait(30s);
    EXPECT_TRUE(status.has_value()) << out;
    int code = status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
    return {code, out};
  }

  fs::path logs() const {
    return dir_ / "logs";
  }

  // The one file named `name` under the log directory.
  std::string log_file(const std::string& name) {
    for (const auto& e : fs::recursive_directory_iterator(logs())) {
      if (e.path().filename() == name) {
        std::ifstream in(e.path());
        return {std::istreambuf_iterator<char>(in), {}};
      }
    }
    ADD_FAILURE() << "no " << name << " under " << logs();
    return "";
  }

  static bool has(const std::string& out, const std::string& needle) {
    return out.find(needle) != std::string::npos;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  std::string worker_;
};

TEST_F(TorchrunParityTest, VirtualLocalRankGivesEachWorkerItsOwnDevice) {
  auto [code, out] =
      run({"--nproc-per-node=2", "--virtual-local-rank"},
          {{"CUDA_VISIBLE_DEVICES", "3, 5"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "rank 0 LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=3 ")) << out;
  EXPECT_TRUE(has(out, "rank 1 LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=5 ")) << out;
  // No list: the local rank is the device; PET_VIRTUAL_LOCAL_RANK=1 too.
  std::tie(code, out) =
      run({"--nproc-per-node=2"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "rank 1 LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=1 ")) << out;
  // Off: the real local rank, the list untouched.
  std::tie(code, out) =
      run({"--nproc-per-node=2"}, {{"CUDA_VISIBLE_DEVICES", "3,5"}});
  EXPECT_TRUE(has(out, "rank 1 LOCAL_RANK=1 CUDA_VISIBLE_DEVICES=3,5 ")) << out;
  // Too short a list: torch's error, naming both, and no worker runs.
  std::tie(code, out) =
      run({"--nproc-per-node=2", "--virtual-local-rank"},
          {{"CUDA_VISIBLE_DEVICES", "7"}});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(
      has(out, "local_rank 1 exceeds available GPUs in CUDA_VISIBLE_DEVICES=7"))
      << out;
}

TEST_F(TorchrunParityTest, DuplicateFiltersCopyMatchingTeedLinesToOneFile) {
  // ",," is a comma: "disk," matches "warn: disk, slow" but not a line
  // with "disk" alone.
  auto [code, out] = run(
      {"--nproc-per-node=2",
       "--tee=3",
       "--duplicate-stdout-filters=loss,step 9",
       "--duplicate-stderr-filters=disk,,"});
  EXPECT_EQ(code, 0) << out;
  std::string filtered_out = log_file("filtered_stdout.log");
  EXPECT_TRUE(has(filtered_out, "[default0]:loss 0.5, step 0\n"))
      << filtered_out;
  EXPECT_TRUE(has(filtered_out, "[default1]:loss 0.5, step 1\n"))
      << filtered_out;
  EXPECT_FALSE(has(filtered_out, "LOCAL_RANK")) << filtered_out;
  std::string filtered_err = log_file("filtered_stderr.log");
  EXPECT_TRUE(has(filtered_err, "[default0]:warn: disk, slow\n"))
      << filtered_err;
  // Each rank's own logs still have everything.
  EXPECT_TRUE(has(out, "[default1]:rank 1 LOCAL_RANK=1")) << out;
}

TEST_F(TorchrunParityTest, TheLinePrefixTemplateNamesRoleRankAndLocalRank) {
  auto [code, out] =
      run({"--nproc-per-node=2", "--tee=1", "--role=trainer"},
          {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
            "[${role_name} r${rank} l$local_rank $$ $unknown] "}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "[trainer r1 l1 $ $unknown] loss 0.5, step 1")) << out;
  EXPECT_FALSE(has(out, "[trainer1]:")) << out;
}

TEST_F(TorchrunParityTest, ACommandLineBeatsPetWhichBeatsTheLegacyVariable) {
  auto timeout_of = [&](std::vector<std::string> args,
                        std::vector<std::pair<std::string, std::string>> env) {
    env.emplace_back("TIDE_LOG_LEVEL", "debug");
    auto [code, out] = run(std::move(args), std::move(env));
    EXPECT_EQ(code, 0) << out;
    std::smatch m;
    static const std::regex re("--shutdown-timeout=([0-9.]+)");
    return std::regex_search(out, m, re) ? m[1].str() : out;
  };
  EXPECT_EQ(timeout_of({}, {}), "30");
  EXPECT_EQ(timeout_of({}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}}), "7");
  EXPECT_EQ(
      timeout_of(
          {},
          {{"PET_SHUTDOWN_TIMEOUT", "5"},
           {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}}),
      "5");
  EXPECT_EQ(
      timeout_of({"--shutdown-timeout=2"}, {{"PET_SHUTDOWN_TIMEOUT", "5"}}),
      "2");
  auto [code, out] = run({"--shutdown-timeout=-1"});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "shutdown_timeout must be non-negative, got -1")) << out;

  // Signals: PET_SIGNALS_TO_HANDLE is read; TORCHELASTIC_SIGNALS_TO_HANDLE
  // is what the workers are told (torch overwrites it, never reads it).
  std::tie(code, out) =
      run({},
          {{"PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1"},
           {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGINT"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "SIGNALS=SIGTERM,SIGUSR1\n")) << out;
  std::tie(code, out) = run({"--signals-to-handle=SIGHUP"});
  EXPECT_TRUE(has(out, "SIGNALS=SIGHUP\n")) << out;
}

TEST_F(TorchrunParityTest, AOneNodeJobWithoutAPortTakesAFreeOne) {
  auto [code, out] = run({"--nproc-per-node=1"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_FALSE(has(out, "MASTER_PORT=29500")) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("MASTER_PORT=[1-9][0-9]*")))
      << out;
  // A port that is given is used.
  std::tie(code, out) = run({"--master-port=0"});
  EXPECT_EQ(code, 0) << out;
  std::tie(code, out) = run({"--nproc-per-node=1"}, {{"PET_MASTER_PORT", "0"}});
  EXPECT_EQ(code, 0) << out;
}

TEST_F(TorchrunParityTest, DeviceCountsAndBadValuesUseTorchsTexts) {
  auto [code, out] = run({"--nproc-per-node=cuda"});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "Unsupported nproc_per_node value: cuda")) << out;
  std::tie(code, out) = run({"--local-ranks-filter=0,x"});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(
      out,
      "--local_ranks_filter must be a comma-separated list of integers e.g. "
      "--local_ranks_filter=0,1,2"))
      << out;
  // No Intel GPU here (ZE_AFFINITY_MASK empty: none visible).
  std::tie(code, out) =
      run({"--nproc-per-node=xpu"}, {{"ZE_AFFINITY_MASK", ""}});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "Xpu is not available.")) << out;
  std::tie(code, out) =
      run({"--nproc-per-node=gpu"}, {{"CUDA_VISIBLE_DEVICES", ""}});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "Cuda is not available.")) << out;
  std::tie(code, out) =
      run({"--nproc-per-node=gpu"}, {{"CUDA_VISIBLE_DEVICES", "0,1"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "rank 1 ")) << out;
}

TEST_F(TorchrunParityTest, TorchsPluginNamesAreTakenWhereTideHasThem) {
  auto [code, out] = run({"--event-log-handler=console"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "\"name\":\"torchelastic.worker.status.SUCCEEDED\""))
      << out;
  for (const char* quiet : {"null", "dynamic_rendezvous"}) {
    std::tie(code, out) = run({std::string("--event-log-handler=") + quiet});
    EXPECT_EQ(code, 0) << out;
    EXPECT_FALSE(has(out, "torchelastic.worker.status")) << out;
  }
  std::tie(code, out) = run({"--event-log-handler=my_plugin"});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "--events log|jsonl:PATH")) << out;
  std::tie(code, out) = run({"--logs-specs=default"});
  EXPECT_EQ(code, 0) << out;
  std::tie(code, out) = run({"--logs-specs=my_specs"});
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(
      out, "Could not find entrypoint under 'torchrun.logs_specs[my_specs]'"))
      << out;
}

TEST_F(TorchrunParityTest, TheHealthCheckPortVariableServesHealth) {
  auto [code, out] = run({}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "0"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "health checks on port")) << out;
  std::tie(code, out) = run({}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "abc"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(
      out,
      "Invalid healthcheck port value: 'abc', expecting integer. Not starting "
      "healthcheck server."))
      << out;
  EXPECT_FALSE(has(out, "health checks on port")) << out;
}

}  // namespace
}  // namespace tide
