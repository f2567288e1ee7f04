#include "tide/agent/entrypoint.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>

#include "tide/agent/error_file.h"
#include "tide/common/error.h"

#include "agent/entrypoint_run.h"
#include "common/demangle.h"

namespace tide::agent {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, WorkerFunction> functions;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void register_function(const std::string& name, WorkerFunction fn) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.functions.emplace(name, std::move(fn)).second) {
    throw InvalidArgument(
        "a worker function named \"" + name + "\" is already registered");
  }
}

const WorkerFunction* find_function(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.functions.find(name);
  return it == r.functions.end() ? nullptr : &it->second;
}

namespace detail {

int run_function(
    const std::string& name,
    const std::vector<std::string>& args,
    const std::string& result_file) {
  const char* error_file = std::getenv("TORCHELASTIC_ERROR_FILE");
  auto fail = [&](const std::string& message) {
    if (error_file != nullptr && *error_file != '\0') {
      write_error_file(error_file, message, "");
    }
    std::fprintf(
        stderr,
        "worker function %s failed: %s\n",
        name.c_str(),
        message.c_str());
    return 1;
  };
  const WorkerFunction* fn = find_function(name);
  if (fn == nullptr) {
    return fail("no function registered as \"" + name + "\" in this binary");
  }
  try {
    std::string value = (*fn)(args);
    std::ofstream out(result_file, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out) {
      return fail("cannot write the return value to " + result_file);
    }
  } catch (const std::exception& e) {
    return fail(type_name(e) + ": " + e.what());
  } catch (...) {
    return fail("unknown exception");
  }
  return 0;
}

}  // namespace detail

void run_worker_if_spawned(int argc, char** argv) {
  const char* name = std::getenv(detail::kFunctionEnv);
  const char* result = std::getenv(detail::kResultFileEnv);
  if (name == nullptr || result == nullptr) {
    return;
  }
  std::string fn = name;
  std::string result_file = result;
  // Not inherited by whatever the function starts.
  ::unsetenv(detail::kFunctionEnv);
  ::unsetenv(detail::kResultFileEnv);
  std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  std::fflush(stdout);
  int code = detail::run_function(fn, args, result_file);
  std::fflush(nullptr);
  std::exit(code);
}

}  // namespace tide::agent
