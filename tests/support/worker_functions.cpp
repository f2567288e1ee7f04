#include "support/worker_functions.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "tide/agent/entrypoint.h"
#include "tide/timer/heartbeat.h"

namespace tide::test {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

void register_worker_functions() {
  using tide::agent::register_function;
  register_function("rank", [](const std::vector<std::string>&) {
    return env("RANK") + "/" + env("WORLD_SIZE") + "/" +
           env("TORCHELASTIC_RESTART_COUNT");
  });
  register_function("fail_first_attempt", [](const std::vector<std::string>&) {
    if (env("TORCHELASTIC_RESTART_COUNT") == "0" && env("LOCAL_RANK") == "1") {
      throw std::runtime_error("failing on purpose in attempt 0");
    }
    return std::string("ok");
  });
  register_function(
      "throw", [](const std::vector<std::string>&) -> std::string {
        throw std::invalid_argument("bad input");
      });
  register_function(
      "heartbeat_then_hang",
      [](const std::vector<std::string>&) -> std::string {
        for (int i = 0; i < 3; ++i) {
          tide::timer::heartbeat();
        }
        for (;;) {
          ::pause();
        }
      });
  register_function(
      "exit_code", [](const std::vector<std::string>& args) -> std::string {
        std::fflush(nullptr);
        std::_Exit(std::stoi(args.at(0)));
      });
}

}  // namespace tide::test
