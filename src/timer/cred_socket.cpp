#include "timer/cred_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "tide/common/error.h"
#include "tide/common/logging.h"

namespace tide::timer::detail {

namespace {

sockaddr_un address(const std::string& path, const char* what) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    throw InvalidArgument(std::string(what) + " socket path too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Fd bind_credential_socket(const std::string& path, const char* what) {
  sockaddr_un addr = address(path, what);
  Fd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) {
    throw Error(std::string(what) + " socket: " + std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
  ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    throw Error(
        std::string("cannot bind the ") + what + " socket " + path + ": " +
        std::strerror(err));
  }
  return fd;
}

Fd connect_datagram_socket(const std::string& path, const char* what) {
  sockaddr_un addr = address(path, what);
  Fd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (fd &&
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
          0) {
    int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

void receive_with_credentials(
    int fd,
    size_t max_len,
    const char* what,
    const std::function<void(pid_t, std::string_view)>& on_datagram) {
  // Up to kBatch datagrams per system call.
  constexpr unsigned kBatch = 32;
  struct Slot {
    std::vector<char> data;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    iovec iov;
  };
  static thread_local std::vector<Slot> slots(kBatch);
  mmsghdr msgs[kBatch];
  for (;;) {
    for (unsigned i = 0; i < kBatch; ++i) {
      // One byte more than allowed, so an oversized datagram shows.
      slots[i].data.resize(max_len + 1);
      slots[i].iov = {
          .iov_base = slots[i].data.data(), .iov_len = slots[i].data.size()};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &slots[i].iov;
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = slots[i].control;
      msgs[i].msg_hdr.msg_controllen = sizeof slots[i].control;
    }
    int n = ::recvmmsg(fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0) {
      return;
    }
    for (int i = 0; i < n; ++i) {
      msghdr& msg = msgs[i].msg_hdr;
      size_t len = msgs[i].msg_len;
      const ucred* cred = nullptr;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
           c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
          cred = reinterpret_cast<const ucred*>(CMSG_DATA(c));
        }
      }
      if (cred == nullptr || len > max_len || (msg.msg_flags & MSG_TRUNC)) {
        TIDE_LOG_WARN(
            "[{}] skipping a malformed datagram ({} bytes)", what, len);
        continue;
      }
      on_datagram(
          cred->pid,
          std::string_view(slots[static_cast<size_t>(i)].data.data(), len));
    }
    if (static_cast<unsigned>(n) < kBatch) {
      return;
    }
  }
}

}  // namespace tide::timer::detail
