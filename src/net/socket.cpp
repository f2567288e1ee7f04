#include "net/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tide/common/error.h"

namespace tide::net {

namespace {

// One non-blocking connect attempt to one resolved address.
Fd try_address(const addrinfo& ai, Clock::time_point deadline, int& err) {
  Fd s(
      ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s) {
    err = errno;
    return {};
  }
  int r = ::connect(s.get(), ai.ai_addr, ai.ai_addrlen);
  if (r < 0 && errno == EINPROGRESS) {
    pollfd p{.fd = s.get(), .events = POLLOUT, .revents = 0};
    if (::poll(&p, 1, std::min(remaining_ms(deadline), 5000)) == 1) {
      socklen_t len = sizeof err;
      err = 0;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
    } else {
      err = ETIMEDOUT;
      r = -1;
    }
  } else if (r < 0) {
    err = errno;
  }
  if (r != 0) {
    return {};
  }
  int one = 1;
  ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

}  // namespace

Fd connect_tcp(
    const std::string& host,
    uint16_t port,
    Clock::time_point deadline,
    std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc =
      ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    error = "cannot resolve " + host + ": " + ::gai_strerror(rc);
    return {};
  }
  Fd fd;
  for (addrinfo* ai = res; ai != nullptr && !fd; ai = ai->ai_next) {
    int err = 0;
    fd = try_address(*ai, deadline, err);
    if (!fd) {
      error = std::strerror(err);
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

uint16_t free_port(const std::string& host) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  if (!fd || ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
      ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw NetworkError(
        "cannot pick a free port on " + host + ": " + std::strerror(errno));
  }
  return ntohs(a.sin_port);
}

}  // namespace tide::net
