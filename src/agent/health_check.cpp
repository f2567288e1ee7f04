// The built-in health checks, and the agent running them before each
// rendezvous.
#include "tide/agent/health_check.h"

#include <poll.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>

#include "tide/common/logging.h"
#include "tide/common/strings.h"
#include "tide/events/events.h"
#include "tide/metrics/metrics.h"
#include "tide/metrics/registry.h"

#include "agent/command.h"
#include "agent/health_checks.h"
#include "agent/reporting.h"
#include "net/address.h"
#include "net/socket.h"

namespace tide::agent {

namespace {

using std::chrono::milliseconds;

class CommandCheck final : public HealthCheck {
 public:
  explicit CommandCheck(std::string command) : command_(std::move(command)) {}
  std::string name() const override {
    return "command";
  }
  HealthCheckResult run(const HealthCheckContext& context) override {
    auto out =
        detail::run_command({"/bin/sh", "-c", command_}, context.timeout);
    // The end of the output says most about why.
    constexpr size_t kShown = 4096;
    std::string text(trim(
        out.output.size() > kShown
            ? "..." + out.output.substr(out.output.size() - kShown)
            : out.output));
    if (out.timed_out) {
      return {
          false,
          "`" + command_ + "` did not finish within " +
              std::to_string(context.timeout.count()) + " ms" +
              (text.empty() ? "" : ": " + text)};
    }
    if (out.exitcode != 0) {
      std::string how =
          out.exitcode < 0
              ? "was killed by signal " + std::to_string(-out.exitcode)
              : "exited with " + std::to_string(out.exitcode);
      return {
          false,
          "`" + command_ + "` " + how + (text.empty() ? "" : ": " + text)};
    }
    return {true, text};
  }

 private:
  std::string command_;
};

class DiskSpaceCheck final : public HealthCheck {
 public:
  DiskSpaceCheck(uint64_t min_free, std::string dir)
      : min_free_(min_free), dir_(std::move(dir)) {}
  std::string name() const override {
    return "disk_space";
  }
  HealthCheckResult run(const HealthCheckContext& context) override {
    const std::string& dir = dir_.empty() ? context.log_dir : dir_;
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) {
      return {false, "cannot stat " + dir + ": " + std::strerror(errno)};
    }
    uint64_t free = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    std::string what = human_bytes(free) + " free in " + dir + " (need " +
                       human_bytes(min_free_) + ")";
    return {free >= min_free_, what};
  }

 private:
  uint64_t min_free_;
  std::string dir_;
};

class EndpointCheck final : public HealthCheck {
 public:
  explicit EndpointCheck(std::string host_port)
      : endpoint_(net::parse_host_port(host_port)) {}
  std::string name() const override {
    return "endpoint";
  }
  HealthCheckResult run(const HealthCheckContext& context) override {
    std::string error;
    std::string where = net::format_host_port(endpoint_.host, endpoint_.port);
    Fd fd = net::connect_tcp(
        endpoint_.host, endpoint_.port, Clock::now() + context.timeout, error);
    if (!fd) {
      return {
          false,
          "cannot reach the rendezvous endpoint " + where + ": " + error};
    }
    return {true, where + " reachable"};
  }

 private:
  net::HostPort endpoint_;
};

}  // namespace

std::shared_ptr<HealthCheck> command_health_check(std::string command) {
  if (command.empty()) {
    throw InvalidArgument("a health check command must not be empty");
  }
  return std::make_shared<CommandCheck>(std::move(command));
}

std::shared_ptr<HealthCheck> disk_space_health_check(
    uint64_t min_free_bytes, std::string dir) {
  return std::make_shared<DiskSpaceCheck>(min_free_bytes, std::move(dir));
}

std::shared_ptr<HealthCheck> endpoint_health_check(std::string host_port) {
  return std::make_shared<EndpointCheck>(std::move(host_port));
}

uint64_t parse_size(const std::string& text, const char* what) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  std::string_view unit(ptr, static_cast<size_t>(end - ptr));
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) {
    unit.remove_suffix(1);
  }
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) {
    unit.remove_suffix(1);
  }
  int shift = -1;
  if (unit.empty()) {
    shift = 0;
  } else if (unit.size() == 1) {
    switch (unit[0]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      case 't':
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
  }
  if (text.empty() || ec != std::errc() || shift < 0 || !(value >= 0) ||
      value * std::ldexp(1.0, shift) > 1.8e19) {
    throw InvalidArgument(
        std::string(what) + ": \"" + text +
        "\" is not a size (a number of bytes, or with K, M, G or T)");
  }
  return static_cast<uint64_t>(value * std::ldexp(1.0, shift));
}

namespace detail {

HealthChecks::HealthChecks(
    const AgentView& view,
    const Reporter& reporter,
    std::function<void(Clock::time_point)> pause)
    : view_(view), reporter_(reporter), pause_(std::move(pause)) {}

void HealthChecks::before_rendezvous() {
  const WorkerSpec& spec = view_.spec;
  const HealthCheckPolicy& policy = spec.health;
  if (policy.checks.empty()) {
    return;
  }
  milliseconds backoff = policy.backoff;
  for (int attempt = 0;; ++attempt) {
    std::string failed;
    for (const auto& check : policy.checks) {
      auto start = Clock::now();
      HealthCheckResult r;
      try {
        r = check->run(
            {.log_dir = view_.run_log_dir, .timeout = policy.timeout});
      } catch (const std::exception& e) {
        r = {false, std::string("the check threw: ") + e.what()};
      }
      auto took =
          std::chrono::duration_cast<milliseconds>(Clock::now() - start);
      metrics::put_metric(
          "health_check." + check->name() + ".healthy", r.healthy ? 1 : 0);
      metrics::put_metric(
          "health_check." + check->name() + ".duration_ms", took.count());
      metrics::histogram(
          "tide_agent_health_check_seconds",
          "Time a health check before a rendezvous took.",
          reporter_.labels({{"check", check->name()}}))
          .observe(std::chrono::duration<double>(took).count());
      if (!r.healthy) {
        metrics::counter(
            "tide_agent_health_check_failures_total",
            "Health checks before a rendezvous that found the node unhealthy.",
            reporter_.labels({{"check", check->name()}}))
            .inc();
      }
      reporter_.agent_event(
          "health_check",
          {{"check", check->name()},
           {"healthy", r.healthy},
           {"duration_ms", static_cast<int64_t>(took.count())},
           {"attempt", int64_t{attempt}},
           {"detail", r.detail}});
      if (!r.healthy) {
        TIDE_LOG_WARN(
            "[{}] health check \"{}\" failed in {} ms: {}",
            spec.role,
            check->name(),
            took.count(),
            r.detail);
        failed = check->name() + ": " + r.detail;
        break;
      }
      TIDE_LOG_DEBUG(
          "[{}] health check \"{}\" passed in {} ms",
          spec.role,
          check->name(),
          took.count());
    }
    if (failed.empty()) {
      if (attempt > 0) {
        TIDE_LOG_INFO("[{}] health checks pass again; joining", spec.role);
      }
      return;
    }
    if (policy.retries >= 0 && attempt >= policy.retries) {
      throw HealthCheckError(
          "this node failed its health check and stays out of the job (" +
          std::to_string(attempt + 1) + " attempt(s)): " + failed);
    }
    TIDE_LOG_INFO(
        "[{}] not joining the rendezvous; health checks again in {} ms",
        spec.role,
        backoff.count());
    pause_(Clock::now() + backoff);
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace detail

}  // namespace tide::agent
