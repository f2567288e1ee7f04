#include "tide/timer/local_timer.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tide/common/logging.h"

// Datagram layout: f64 expiration_time, i32 signal, then the scope bytes.
// The sender's pid is not in it: the kernel supplies it.
namespace tide::timer {

namespace {

constexpr size_t kHeader = sizeof(double) + sizeof(int32_t);
constexpr size_t kMaxScope = 4096;

sockaddr_un address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    throw InvalidArgument("timer socket path too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

LocalTimerServer::LocalTimerServer(std::string path, TimerServerOptions options)
    : TimerServer(std::move(options)), path_(std::move(path)) {
  sockaddr_un addr = address(path_);
  fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) {
    throw Error(std::string("timer socket: ") + std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd_.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
  ::unlink(path_.c_str());
  if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    throw Error(
        "cannot bind the timer socket " + path_ + ": " + std::strerror(err));
  }
}

LocalTimerServer::~LocalTimerServer() {
  stop();
  fd_.reset();
  ::unlink(path_.c_str());
}

void LocalTimerServer::read_requests(std::vector<TimerRequest>& out) {
  // Up to kBatch datagrams per system call.
  constexpr unsigned kBatch = 32;
  struct Slot {
    char data[kHeader + kMaxScope + 1];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    iovec iov;
  };
  static thread_local std::vector<Slot> slots(kBatch);
  mmsghdr msgs[kBatch];
  for (;;) {
    for (unsigned i = 0; i < kBatch; ++i) {
      slots[i].iov = {
          .iov_base = slots[i].data, .iov_len = sizeof slots[i].data};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &slots[i].iov;
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = slots[i].control;
      msgs[i].msg_hdr.msg_controllen = sizeof slots[i].control;
    }
    int n = ::recvmmsg(fd_.get(), msgs, kBatch, MSG_DONTWAIT, nullptr);
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
      if (cred == nullptr || len < kHeader || len > kHeader + kMaxScope ||
          (msg.msg_flags & MSG_TRUNC)) {
        TIDE_LOG_WARN("[timer] skipping a malformed datagram ({} bytes)", len);
        continue;
      }
      const char* data = slots[static_cast<size_t>(i)].data;
      TimerRequest r;
      std::memcpy(&r.expiration_time, data, sizeof(double));
      int32_t sig = 0;
      std::memcpy(&sig, data + sizeof(double), sizeof sig);
      r.signal = sig;
      r.worker_id = cred->pid;
      r.scope_id.assign(data + kHeader, len - kHeader);
      out.push_back(std::move(r));
    }
    if (static_cast<unsigned>(n) < kBatch) {
      return;
    }
  }
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
      fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      sockaddr_un addr = address(path_);
      if (!fd_ ||
          ::connect(
              fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
              0) {
        int err = errno;
        fd_.reset();
        throw Error("no timer server on " + path_ + ": " + std::strerror(err));
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
