#include "tide/common/logging.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tide {

namespace {

// A level's name, in any case, with Python's spellings too (LOGLEVEL is
// torchrun's variable: WARNING, CRITICAL, FATAL).
std::optional<spdlog::level::level_enum> parse_level(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  using spdlog::level::level_enum;
  static const std::pair<const char*, level_enum> kNames[] = {
      {"trace", level_enum::trace},
      {"debug", level_enum::debug},
      {"info", level_enum::info},
      {"warn", level_enum::warn},
      {"warning", level_enum::warn},
      {"error", level_enum::err},
      {"err", level_enum::err},
      {"critical", level_enum::critical},
      {"fatal", level_enum::critical},
      {"off", level_enum::off},
  };
  for (const auto& [name, level] : kNames) {
    if (text == name) {
      return level;
    }
  }
  return std::nullopt;
}

// TIDE_LOG_LEVEL, else LOGLEVEL, else info. A value that names no level
// is said on stderr, not taken as "off".
spdlog::level::level_enum level_from_environment() {
  for (const char* var : {"TIDE_LOG_LEVEL", "LOGLEVEL"}) {
    const char* env = std::getenv(var);
    if (env == nullptr || *env == '\0') {
      continue;
    }
    if (auto level = parse_level(env)) {
      return *level;
    }
    std::fprintf(
        stderr,
        "tide: %s=%s is not a log level (trace, debug, info, warn, error, "
        "critical, off); logging at info\n",
        var,
        env);
    return spdlog::level::info;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("tide", sink);
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [tide] [%^%l%$] %v");
  log->set_level(level_from_environment());
  return log;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> log = make_logger();
  return *log;
}

}  // namespace tide
