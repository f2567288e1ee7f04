#pragma once

#include <string>
#include <vector>

namespace tide::agent::detail {

// Environment of a spawned function worker: which function, where its
// return value goes.
constexpr const char* kFunctionEnv = "TIDE_WORKER_FUNCTION";
constexpr const char* kResultFileEnv = "TIDE_WORKER_RESULT_FILE";

// Runs a registered function in a worker process: writes its return value
// to result_file, or an error file (TORCHELASTIC_ERROR_FILE) when it throws.
// Returns the exit code.
int run_function(
    const std::string& name,
    const std::vector<std::string>& args,
    const std::string& result_file);

}  // namespace tide::agent::detail
