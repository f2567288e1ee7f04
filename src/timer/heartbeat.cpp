#include "tide/timer/heartbeat.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tide/common/error.h"

#include "timer/cred_socket.h"

namespace tide::timer {

namespace {

// A beat's bytes are ignored; anything up to this size is accepted.
constexpr size_t kMaxBeat = 256;

}  // namespace

HeartbeatClient::HeartbeatClient(std::string path) : path_(std::move(path)) {
  // Checked now rather than at the first beat.
  if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
    throw InvalidArgument("heartbeat socket path too long: " + path_);
  }
}

void HeartbeatClient::beat() {
  std::lock_guard lock(mutex_);
  // A restarted agent's socket refuses the old connection: reconnect once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!fd_) {
      fd_ = detail::connect_datagram_socket(path_, "heartbeat");
      if (!fd_) {
        throw Error(
            "no agent takes heartbeats on " + path_ + ": " +
            std::strerror(errno));
      }
    }
    if (::send(fd_.get(), ".", 1, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0 ||
        errno == EAGAIN) {
      return;
    }
    int err = errno;
    fd_.reset();
    if (err != ECONNREFUSED || attempt == 1) {
      throw Error(
          "cannot send a heartbeat to " + path_ + ": " + std::strerror(err));
    }
  }
}

bool heartbeat() {
  static const char* path = std::getenv(kHeartbeatSocketEnv);
  if (path == nullptr || *path == '\0') {
    return false;
  }
  static HeartbeatClient client(path);
  client.beat();
  return true;
}

HeartbeatReceiver::HeartbeatReceiver(std::string path)
    : path_(std::move(path)),
      fd_(detail::bind_credential_socket(path_, "heartbeat")) {}

HeartbeatReceiver::~HeartbeatReceiver() {
  fd_.reset();
  ::unlink(path_.c_str());
}

std::vector<pid_t> HeartbeatReceiver::drain() {
  std::vector<pid_t> out;
  detail::receive_with_credentials(
      fd_.get(), kMaxBeat, "heartbeat", [&](pid_t pid, std::string_view) {
        out.push_back(pid);
      });
  return out;
}

}  // namespace tide::timer
