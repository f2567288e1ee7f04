#include "tide/timer/local_timer.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tide/common/logging.h"

#include "timer/cred_socket.h"

// Datagram layout: f64 expiration_time, i32 signal, then the scope bytes.
// The sender's pid is not in it: the kernel supplies it.
namespace tide::timer {

namespace {

constexpr size_t kHeader = sizeof(double) + sizeof(int32_t);
constexpr size_t kMaxScope = 4096;

}  // namespace

LocalTimerServer::LocalTimerServer(std::string path, TimerServerOptions options)
    : TimerServer(std::move(options)),
      path_(std::move(path)),
      fd_(detail::bind_credential_socket(path_, "timer")) {}

LocalTimerServer::~LocalTimerServer() {
  stop();
  fd_.reset();
  ::unlink(path_.c_str());
}

void LocalTimerServer::read_requests(std::vector<TimerRequest>& out) {
  detail::receive_with_credentials(
      fd_.get(),
      kHeader + kMaxScope,
      "timer",
      [&](pid_t pid, std::string_view data) {
        if (data.size() < kHeader) {
          TIDE_LOG_WARN(
              "[timer] skipping a malformed datagram ({} bytes)", data.size());
          return;
        }
        TimerRequest r;
        std::memcpy(&r.expiration_time, data.data(), sizeof(double));
        int32_t sig = 0;
        std::memcpy(&sig, data.data() + sizeof(double), sizeof sig);
        r.signal = sig;
        r.worker_id = pid;
        r.scope_id.assign(data.substr(kHeader));
        out.push_back(std::move(r));
      });
}

LocalTimerClient::LocalTimerClient(std::string path, int signal)
    : TimerChannelClient(signal), path_(std::move(path)) {}

void LocalTimerClient::send(
    const std::string& scope_id, double expiration_time, int signal) {
  if (scope_id.size() > kMaxScope) {
    throw InvalidArgument(
        "timer scope longer than " + std::to_string(kMaxScope) + " bytes");
  }
  char data[kHeader + kMaxScope];
  std::memcpy(data, &expiration_time, sizeof(double));
  int32_t sig = signal;
  std::memcpy(data + sizeof(double), &sig, sizeof sig);
  std::memcpy(data + kHeader, scope_id.data(), scope_id.size());
  std::lock_guard lock(mutex_);
  // Connected once (the path is resolved once); a server that was replaced
  // refuses the old connection, so reconnect once then.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!fd_) {
      fd_ = detail::connect_datagram_socket(path_, "timer");
      if (!fd_) {
        throw Error(
            "no timer server on " + path_ + ": " + std::strerror(errno));
      }
    }
    // Blocking: a full server queue makes the caller wait, never drops.
    if (::send(fd_.get(), data, kHeader + scope_id.size(), MSG_NOSIGNAL) >= 0) {
      return;
    }
    int err = errno;
    fd_.reset();
    if (err != ECONNREFUSED || attempt == 1) {
      throw Error(
          "cannot send a timer request to " + path_ + ": " +
          std::strerror(err));
    }
  }
}

}  // namespace tide::timer
