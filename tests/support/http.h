#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>

namespace tide::test {

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET http://127.0.0.1:port/path with HTTP/1.0; nullopt when nothing
// answers within timeout.
inline std::optional<HttpResponse> http_get(
    uint16_t port,
    const std::string& path,
    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string raw;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 ||
        ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      ::close(fd);
      return std::nullopt;
    }
    char buf[8192];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      break;
    }
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  HttpResponse r;
  auto sp = raw.find(' ');
  if (sp == std::string::npos) {
    return std::nullopt;
  }
  r.status = std::atoi(raw.c_str() + sp + 1);
  auto body = raw.find("\r\n\r\n");
  r.body = body == std::string::npos ? "" : raw.substr(body + 4);
  return r;
}

}  // namespace tide::test
