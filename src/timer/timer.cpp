#include "tide/timer/timer.h"

#include <mutex>

#include "tide/common/logging.h"

#include "common/clock.h"

namespace tide::timer {

namespace {

std::mutex g_mutex;
std::shared_ptr<TimerClient> g_client;  // Guarded by g_mutex.

}  // namespace

double now() {
  return now_seconds();
}

void configure(std::shared_ptr<TimerClient> client) {
  std::lock_guard lock(g_mutex);
  g_client = std::move(client);
}

std::shared_ptr<TimerClient> configured_client() {
  std::lock_guard lock(g_mutex);
  return g_client;
}

Expires::Expires(
    std::shared_ptr<TimerClient> client, std::string scope, Seconds after)
    : client_(std::move(client)), scope_(std::move(scope)) {
  client_->acquire(scope_, now() + after.count());
}

Expires::Expires(Expires&& other) noexcept
    : client_(std::move(other.client_)), scope_(std::move(other.scope_)) {}

Expires::~Expires() {
  if (!client_) {
    return;
  }
  try {
    client_->release(scope_);
  } catch (const std::exception& e) {
    TIDE_LOG_WARN("[timer] releasing \"{}\" failed: {}", scope_, e.what());
  }
}

Expires expires(
    Seconds after,
    std::string scope,
    std::shared_ptr<TimerClient> client,
    std::source_location where) {
  if (!client) {
    client = configured_client();
  }
  if (!client) {
    throw InvalidArgument(
        "tide::timer::expires: no timer client; call tide::timer::configure() "
        "first (e.g. with a FileTimerClient on $TORCHELASTIC_TIMER_FILE)");
  }
  if (scope.empty()) {
    scope = std::string(where.file_name()) + "#" + std::to_string(where.line());
  }
  return Expires(std::move(client), std::move(scope), after);
}

}  // namespace tide::timer
