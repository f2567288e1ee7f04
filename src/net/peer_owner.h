#pragma once

#include <cstdint>
#include <string>

// Who is at the other end of an accepted TCP connection, as the kernel
// knows it. A process of this host (in this network namespace) holds the
// other socket of the pair, and the kernel's socket tables name that
// socket's owner: the uid of the process that made it. tide asks them with
// one sock_diag request (NETLINK_SOCK_DIAG, an exact lookup by the pair's
// addresses: what `ss -e` reads), not by scanning /proc/net/tcp, so that
// the cost of an accept does not grow with the sockets of the host.
namespace tide::net {

struct PeerOwner {
  enum class Kind {
    kLocal,    // a socket of this host: `uid` owns it
    kRemote,   // no socket of this host has the pair: another host (or
               // another network namespace)
    kUnknown,  // the tables could not be asked: `error` says why
  };
  Kind kind = Kind::kUnknown;
  uint32_t uid = 0;
  std::string error;
};

// The owner of the other end of connected TCP socket `fd` (IPv4 or IPv6,
// an IPv4-mapped peer included). Blocking, but the kernel answers at once;
// never throws.
PeerOwner tcp_peer_owner(int fd);

}  // namespace tide::net
