#pragma once

#include <unistd.h>

#include <utility>

namespace tide {

// A file descriptor owned by one object: closed when it goes away, moved
// (never copied) between owners. -1 holds nothing.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset(std::exchange(other.fd_, -1));
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    reset();
  }

  int get() const noexcept {
    return fd_;
  }
  bool valid() const noexcept {
    return fd_ >= 0;
  }
  explicit operator bool() const noexcept {
    return valid();
  }
  // Gives the descriptor up without closing it.
  int release() noexcept {
    return std::exchange(fd_, -1);
  }
  // Closes the descriptor held (if any) and holds `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace tide
