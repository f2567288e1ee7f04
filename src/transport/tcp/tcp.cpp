// TCP: connecting to a peer's host:port (a name is resolved first) and
// accepting peers' connections.
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>

#include "tide/common/logging.h"

#include "net/peer_owner.h"
#include "transport/connection.h"
#include "transport/transport_impl.h"

namespace tide::transport {

using asio::ip::tcp;
using Endpoint = asio::generic::stream_protocol::endpoint;

void Transport::Impl::connect_tcp(
    const std::shared_ptr<Connection>& conn, std::function<void()> connected) {
  PeerAddress peer;
  {
    std::lock_guard lock(peers_mutex);
    peer = peers.at(conn->peer_id);
  }
  asio::error_code ec;
  auto address = asio::ip::make_address(peer.host, ec);
  std::vector<Endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(tcp::endpoint(address, peer.port));
  } else {
    tcp::resolver resolver(loop.io());
    for (const auto& r :
         resolver.resolve(peer.host, std::to_string(peer.port), ec)) {
      endpoints.emplace_back(r.endpoint());
    }
    if (endpoints.empty()) {
      // Failed on the next turn of the loop, like any connect error.
      asio::post(loop.io(), [conn, what = ec.message(), host = peer.host] {
        conn->fail("cannot resolve '" + host + "': " + what);
      });
      return;
    }
  }
  asio::async_connect(
      conn->socket,
      endpoints,
      [conn, connected = std::move(connected)](
          const asio::error_code& e, const Endpoint&) {
        if (conn->state == Connection::State::kClosed) {
          return;
        }
        if (e) {
          conn->fail("connect failed: " + e.message());
          return;
        }
        conn->start();
        if (connected) {
          connected();
        }
      });
}

Transport::Impl::Admission Transport::Impl::admit_tcp(
    int fd, const std::string& address) const {
  net::PeerOwner owner = net::tcp_peer_owner(fd);
  Admission who{.source = "host " + address};
  if (owner.kind == net::PeerOwner::Kind::kLocal) {
    who.source = "user " + std::to_string(owner.uid);
  }
  if (!options.token.empty() || options.allow_any_uid) {
    return who;  // the proofs say who belongs
  }
  // No secret: only this user's processes (and those allowed) of this host.
  const std::string how =
      "give every worker of the group the same secret: TIDE_RPC_TOKEN, "
      "RpcBackendOptions::token, or start the group with tiderun, which "
      "makes one";
  switch (owner.kind) {
    case net::PeerOwner::Kind::kLocal:
      if (!uid_allowed(owner.uid)) {
        who.refusal =
            "has no secret, so it admits only the processes of "
            "its own user (uid " +
            std::to_string(::geteuid()) +
            ", and TIDE_RPC_ALLOW_UIDS), and this connection is "
            "user " +
            std::to_string(owner.uid) + "'s; to let others in, " + how;
      }
      break;
    case net::PeerOwner::Kind::kRemote:
      who.refusal =
          "has no secret, so it admits only processes of its own host, "
          "and this connection comes from " +
          address +
          ", another host; a group spread over hosts needs one: " + how;
      break;
    case net::PeerOwner::Kind::kUnknown:
      who.refusal = "has no secret and cannot tell who is connecting (" +
                    owner.error + "); " + how;
      break;
  }
  return who;
}

void Transport::Impl::start_accept() {
  acceptor.async_accept([this](const asio::error_code& ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) {
      return;
    }
    if (ec) {
      accept_failed("TCP port", ec, false);
      return;
    }
    accept_backoff = {};
    asio::error_code ep_ec;
    auto endpoint = s.local_endpoint(ep_ec);
    auto peer = s.remote_endpoint(ep_ec);
    if (!ep_ec) {
      auto protocol = endpoint.protocol();
      Admission who = admit_tcp(s.native_handle(), peer.address().to_string());
      adopt(
          Socket(
              loop.io(),
              asio::generic::stream_protocol(
                  protocol.family(), protocol.protocol()),
              s.release()),
          std::move(who));
    }
    start_accept();
  });
}

}  // namespace tide::transport
