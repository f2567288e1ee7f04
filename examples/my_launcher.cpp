// A custom launcher in C++: the same machinery as tiderun, driven from code.
// It parses its arguments, makes a rendezvous handler and a WorkerSpec whose
// entrypoint is a C++ function, runs a LocalElasticAgent and prints worker
// 0's return value or failure.
//
//   my_launcher [--nproc N] [--max-restarts N] [--fail-once] [--start-method
//   fork|spawn]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "tide/agent/entrypoint.h"
#include "tide/agent/local_elastic_agent.h"
#include "tide/rendezvous/registry.h"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The training step of this example: each worker reports who it is. With
// "--fail" as an argument, local rank 1 fails on the first attempt.
std::string trainer(const std::vector<std::string>& args) {
  bool fail_once = !args.empty() && args[0] == "--fail";
  if (fail_once && env("TORCHELASTIC_RESTART_COUNT") == "0" &&
      env("LOCAL_RANK") == "1") {
    throw std::runtime_error("simulated crash of local rank 1 in attempt 0");
  }
  return "rank " + env("RANK") + " of " + env("WORLD_SIZE") +
         " finished attempt " + env("TORCHELASTIC_RESTART_COUNT");
}

}  // namespace

int main(int argc, char** argv) {
  tide::agent::register_function("trainer", trainer);
  // With the spawn start method the workers are this binary again: let
  // them run their function and exit here.
  tide::agent::run_worker_if_spawned(argc, argv);

  int nproc = 2;
  int max_restarts = 1;
  bool fail_once = false;
  std::string start_method = "spawn";
  CLI::App app{
      "my_launcher: run a C++ function on N workers with tide's elastic agent"};
  app.add_option("--nproc", nproc, "workers")->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", max_restarts, "restarts after a failure");
  app.add_flag(
      "--fail-once", fail_once, "make local rank 1 fail on the first attempt");
  app.add_option("--start-method", start_method)
      ->check(CLI::IsMember({"fork", "spawn"}));
  CLI11_PARSE(app, argc, argv);

  // A single-node rendezvous with its store on a free local port.
  std::shared_ptr<tide::rendezvous::RendezvousHandler> handler =
      tide::rendezvous::handler_registry().create({
          .backend = "static",
          .endpoint = "127.0.0.1:0",
          .run_id = "my_launcher",
      });
  tide::agent::WorkerSpec spec{
      .role = "trainer",
      .local_world_size = nproc,
      .entrypoint =
          tide::agent::FunctionCall{
              "trainer",
              fail_once ? std::vector<std::string>{"--fail"}
                        : std::vector<std::string>{}},
      .start_method = start_method == "fork" ? tide::agent::StartMethod::kFork
                                             : tide::agent::StartMethod::kSpawn,
      .rdzv_handler = handler,
      .max_restarts = max_restarts,
  };
  tide::agent::LocalElasticAgent agent(std::move(spec));
  tide::agent::RunResult result = agent.run();
  handler->shutdown();

  if (result.is_failed()) {
    const tide::agent::ProcessFailure* f = result.root_cause();
    std::printf(
        "worker group failed; first failure: rank %d exit code %d: %s\n",
        f->global_rank,
        f->exitcode,
        f->message.c_str());
    return 1;
  }
  std::printf("worker 0 returned: %s\n", result.return_values.at(0).c_str());
  return 0;
}
