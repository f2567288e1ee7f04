#include "net/peer_owner.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "tide/common/fd.h"

namespace tide::net {

namespace {

PeerOwner unknown(const std::string& what) {
  return PeerOwner{
      .kind = PeerOwner::Kind::kUnknown,
      .error = what + ": " + std::strerror(errno)};
}

// An address and port in inet_diag's form (network byte order); an
// IPv4-mapped IPv6 address becomes the IPv4 one, as the peer's socket has it.
struct DiagAddress {
  uint8_t family = 0;
  uint16_t port = 0;
  uint32_t addr[4] = {};
};

DiagAddress diag_address(const sockaddr_storage& ss) {
  DiagAddress a;
  if (ss.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(ss);
    a.family = AF_INET;
    a.port = in.sin_port;
    std::memcpy(a.addr, &in.sin_addr, sizeof in.sin_addr);
  } else if (ss.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(ss);
    a.port = in6.sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      a.family = AF_INET;
      std::memcpy(a.addr, in6.sin6_addr.s6_addr + 12, 4);
    } else {
      a.family = AF_INET6;
      std::memcpy(a.addr, &in6.sin6_addr, sizeof in6.sin6_addr);
    }
  }
  return a;
}

}  // namespace

PeerOwner tcp_peer_owner(int fd) {
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) {
    return unknown("getsockname");
  }
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return unknown("getpeername");
  }
  DiagAddress ours = diag_address(self), theirs = diag_address(peer);
  if (theirs.family == 0 || ours.family != theirs.family) {
    return PeerOwner{.error = "not a TCP connection over IP"};
  }

  // The peer's socket: its own address is our peer's, its remote ours.
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;
  message.header.nlmsg_seq = 1;
  inet_diag_req_v2& req = message.request;
  req.sdiag_family = theirs.family;
  req.sdiag_protocol = IPPROTO_TCP;
  req.idiag_states = ~0u;
  req.id.idiag_sport = theirs.port;
  req.id.idiag_dport = ours.port;
  std::memcpy(req.id.idiag_src, theirs.addr, sizeof theirs.addr);
  std::memcpy(req.id.idiag_dst, ours.addr, sizeof ours.addr);
  req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  Fd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl) {
    return unknown("a sock_diag socket");
  }
  sockaddr_nl kernel{.nl_family = AF_NETLINK};
  if (::sendto(
          nl.get(),
          &message,
          sizeof message,
          0,
          reinterpret_cast<sockaddr*>(&kernel),
          sizeof kernel) != static_cast<ssize_t>(sizeof message)) {
    return unknown("sock_diag request");
  }
  // The kernel answers within the call; the poll only guards a hang.
  pollfd p{.fd = nl.get(), .events = POLLIN, .revents = 0};
  if (::poll(&p, 1, 1000) != 1) {
    errno = ETIMEDOUT;
    return unknown("sock_diag answer");
  }
  alignas(nlmsghdr) char buf[8192];
  ssize_t n = ::recv(nl.get(), buf, sizeof buf, 0);
  if (n < static_cast<ssize_t>(sizeof(nlmsghdr))) {
    return unknown("sock_diag answer");
  }
  auto* h = reinterpret_cast<nlmsghdr*>(buf);
  if (!NLMSG_OK(h, static_cast<unsigned>(n))) {
    return PeerOwner{.error = "sock_diag: a truncated answer"};
  }
  if (h->nlmsg_type == NLMSG_ERROR) {
    const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
    if (e->error == -ENOENT) {
      return PeerOwner{.kind = PeerOwner::Kind::kRemote};
    }
    errno = -e->error;
    return unknown("sock_diag");
  }
  if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return PeerOwner{.error = "sock_diag: an answer of an unexpected type"};
  }
  const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
  return PeerOwner{.kind = PeerOwner::Kind::kLocal, .uid = msg->idiag_uid};
}

}  // namespace tide::net
