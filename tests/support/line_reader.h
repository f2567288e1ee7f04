#pragma once

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace tide::test {

// True when fd turns readable before the deadline.
inline bool poll_readable(
    int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (r < 0 && errno == EINTR) {
      continue;
    }
    return r > 0;
  }
}

// Lines from a child's output pipe, each read with a deadline so a hang
// fails the test. Keeps everything read, for failure messages.
class LineReader {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  explicit LineReader(int fd = -1) : fd_(fd) {}
  void reset(int fd) {
    fd_ = fd;
  }

  // The next whole line (a last unterminated one at end of file too), or
  // nullopt at end of file or at the deadline (eof() tells which).
  std::optional<std::string> read_line(Deadline deadline) {
    for (;;) {
      auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      if (eof_) {
        return std::nullopt;
      }
      if (!poll_readable(fd_, deadline)) {
        return std::nullopt;
      }
      char buf[65536];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        eof_ = true;
        if (!buffer_.empty()) {
          return std::exchange(buffer_, "");
        }
        return std::nullopt;
      }
      buffer_.append(buf, static_cast<size_t>(n));
      transcript_.append(buf, static_cast<size_t>(n));
    }
  }

  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    return read_line(std::chrono::steady_clock::now() + timeout);
  }

  bool eof() const {
    return eof_;
  }
  // Everything read so far.
  const std::string& transcript() const {
    return transcript_;
  }

 private:
  int fd_;
  std::string buffer_;
  std::string transcript_;
  bool eof_ = false;
};

}  // namespace tide::test
