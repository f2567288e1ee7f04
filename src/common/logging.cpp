#include "tide/common/logging.h"

#include <cstdlib>
#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tide {

namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("tide", sink);
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [tide] [%^%l%$] %v");
  auto level = spdlog::level::info;
  if (const char* env = std::getenv("TIDE_LOG_LEVEL"); env != nullptr) {
    level = spdlog::level::from_str(env);
  }
  log->set_level(level);
  return log;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> log = make_logger();
  return *log;
}

}  // namespace tide
