#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

// A bare TCP client for protocol tests: sends exact bytes, reads exact
// replies, and tells whether the server closed the connection, each within
// a deadline so a hang fails the test.
namespace tide::test {

// A listening TCP socket on 127.0.0.1, on a port the kernel picks (written
// to *port). Throws std::runtime_error when it cannot listen.
inline int listen_on_loopback(uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd, 16) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) {
      ::close(fd);
    }
    throw std::runtime_error("cannot listen on 127.0.0.1");
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 ||
        ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw std::runtime_error("RawClient: connect failed");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawClient() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // False when the peer has already closed (EPIPE/ECONNRESET).
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) {
        return false;
      }
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Exactly n bytes; throws on timeout or EOF.
  std::string read(
      size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      if (!readable(deadline)) {
        throw std::runtime_error(
            "RawClient: timed out with " + std::to_string(out.size()) + " of " +
            std::to_string(n) + " bytes");
      }
      char buf[65536];
      ssize_t r = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (r <= 0) {
        throw std::runtime_error("RawClient: connection closed while reading");
      }
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }

  // True when the server closes the connection within timeout (any bytes it
  // sends first are discarded).
  bool closed_within(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (!readable(deadline)) {
        return false;
      }
      char buf[4096];
      ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
      if (r <= 0) {
        return true;
      }
    }
  }

  int fd() const {
    return fd_;
  }

 private:
  bool readable(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) {
        return false;
      }
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0) {
        return true;
      }
      if (r == 0) {
        return false;
      }
    }
  }

  int fd_ = -1;
};

}  // namespace tide::test
