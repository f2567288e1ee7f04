#pragma once

#include <functional>
#include <string>
#include <vector>

// C++ functions as worker entrypoints (torch's function entrypoints). A
// function gets its arguments and returns a value, which reaches
// RunResult::return_values on the agent. An exception it throws fails the
// worker: the agent reports its type and message.
//
//   int main(int argc, char** argv) {
//     tide::agent::register_function("train", [](const auto& args) {
//       return std::string("done");
//     });
//     tide::agent::run_worker_if_spawned(argc, argv);  // before anything else
//     ...
//   }
namespace tide::agent {

using WorkerFunction =
    std::function<std::string(const std::vector<std::string>& args)>;

// Registers fn under name. Throws InvalidArgument when the name is taken.
// Register in every process that runs the agent or spawned workers: the
// spawn start method looks the name up in the re-executed binary.
void register_function(const std::string& name, WorkerFunction fn);

// The registered function, or null.
const WorkerFunction* find_function(const std::string& name);

// When this process is a worker started with StartMethod::kSpawn, runs its
// function and exits (0 on success, 1 when it throws); otherwise returns at
// once. Call it at the top of main(), after registering functions.
void run_worker_if_spawned(int argc, char** argv);

}  // namespace tide::agent
