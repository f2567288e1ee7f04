#include "tide/timer/heartbeat.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
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

void HeartbeatClient::beat(std::optional<int64_t> step) {
  if (step && *step < 0) {
    throw InvalidArgument(
        "heartbeat: the step must be >= 0, got " + std::to_string(*step));
  }
  const std::string text = step ? std::to_string(*step) : ".";
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
    if (::send(
            fd_.get(), text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >=
            0 ||
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

bool heartbeat(std::optional<int64_t> step) {
  static const char* path = std::getenv(kHeartbeatSocketEnv);
  if (path == nullptr || *path == '\0') {
    return false;
  }
  static HeartbeatClient client(path);
  client.beat(step);
  return true;
}

HeartbeatReceiver::HeartbeatReceiver(std::string path)
    : path_(std::move(path)),
      fd_(detail::bind_credential_socket(path_, "heartbeat")) {}

HeartbeatReceiver::~HeartbeatReceiver() {
  fd_.reset();
  ::unlink(path_.c_str());
}

std::vector<Beat> HeartbeatReceiver::drain() {
  std::vector<Beat> out;
  detail::receive_with_credentials(
      fd_.get(), kMaxBeat, "heartbeat", [&](pid_t pid, std::string_view data) {
        Beat b{.pid = pid};
        int64_t step = 0;
        // The digits alone (no sign, no spaces, no trailing bytes).
        auto [end, ec] =
            std::from_chars(data.data(), data.data() + data.size(), step);
        if (!data.empty() &&
            std::isdigit(static_cast<unsigned char>(data[0])) &&
            ec == std::errc() && end == data.data() + data.size()) {
          b.step = step;
        }
        out.push_back(b);
      });
  return out;
}

}  // namespace tide::timer
