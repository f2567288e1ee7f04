#pragma once

// Keep every level in the binary; TIDE_LOG_LEVEL filters at run time.
#ifndef SPDLOG_ACTIVE_LEVEL
#define SPDLOG_ACTIVE_LEVEL SPDLOG_LEVEL_TRACE
#endif
#include <spdlog/spdlog.h>

// Logging through spdlog. The level comes from TIDE_LOG_LEVEL, else from
// torchrun's LOGLEVEL (trace, debug, info, warn or warning, error, critical,
// off, in any case; default info), read once on first use. A value that is
// no level is reported on stderr and logging stays at info.
namespace tide {

// The process-wide tide logger (stderr, "[tide] level" prefix).
spdlog::logger& logger();

}  // namespace tide

#define TIDE_LOG_TRACE(...) \
  SPDLOG_LOGGER_CALL(&::tide::logger(), spdlog::level::trace, __VA_ARGS__)
#define TIDE_LOG_DEBUG(...) \
  SPDLOG_LOGGER_CALL(&::tide::logger(), spdlog::level::debug, __VA_ARGS__)
#define TIDE_LOG_INFO(...) \
  SPDLOG_LOGGER_CALL(&::tide::logger(), spdlog::level::info, __VA_ARGS__)
#define TIDE_LOG_WARN(...) \
  SPDLOG_LOGGER_CALL(&::tide::logger(), spdlog::level::warn, __VA_ARGS__)
#define TIDE_LOG_ERROR(...) \
  SPDLOG_LOGGER_CALL(&::tide::logger(), spdlog::level::err, __VA_ARGS__)
