// The first frames of a connection, each way: HANDSHAKE, HANDSHAKE_ACK and
// PROOF (or REFUSED), or LANE_HELLO for a lane. Who the peer is, whether it
// holds the group's token (proved, never sent: transport/auth.h), and
// whether the pair uses shared memory is settled here.
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include <asio/post.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "transport/auth.h"
#include "transport/connection.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/tcp/lane_path.h"
#include "transport/transport_impl.h"

namespace tide::transport {

namespace {

std::string checked_nonce(FieldReader& r) {
  std::string nonce = r.str();
  if (nonce.size() != auth::kNonceSize) {
    throw ProtocolError(
        "a handshake nonce of " + std::to_string(nonce.size()) +
        " bytes; expected " + std::to_string(auth::kNonceSize));
  }
  return nonce;
}

// What the refusals of a worker that has a token say first.
const std::string kTokenRequired =
    "requires the group's token (RpcBackendOptions::token or TIDE_RPC_TOKEN) "
    "and ";

}  // namespace

const std::string& Connection::secret() const {
  return peer_id == owner.options.self_id ? owner.self_key
                                          : owner.options.token;
}

std::string Transport::Impl::handshake_metadata(
    bool offer_shm, const std::string& nonce) const {
  return FieldWriter()
      .i32(options.self_id)
      .str(options.self_name)
      .u32(offer_shm ? kFeatureSharedMemory : uint32_t{0})
      .str(nonce)
      .u32(options.token.empty() ? 0 : 1)
      .take();
}

std::string Transport::Impl::identity_problem(
    int id, const std::string& name, const Connection& conn) const {
  std::lock_guard lock(peers_mutex);
  if (peers.empty()) {
    return "";  // Not known yet: nothing to hold the claim to.
  }
  auto it = peers.find(id);
  if (it == peers.end()) {
    return "no worker of the group has id " + std::to_string(id);
  }
  if (it->second.name != name) {
    return "worker " + std::to_string(id) + " is '" +
           printable(it->second.name) + "', not '" + printable(name) + "'";
  }
  // A local peer's socket name says its process: tide-rpc-<pid>-<random>.
  const std::string& local_name = it->second.local_name;
  if (conn.local && conn.peer_pid > 0 &&
      local_name.rfind("tide-rpc-", 0) == 0) {
    std::string pid = local_name.substr(9, local_name.find('-', 9) - 9);
    if (pid != std::to_string(conn.peer_pid)) {
      return "worker " + std::to_string(id) + " is process " + pid +
             ", and this connection comes from process " +
             std::to_string(conn.peer_pid);
    }
  }
  return "";
}

void Connection::expect_handshake(Frame& frame) {
  if (state == State::kAwaitingAck) {
    if (frame.type == ControlType::kRefused) {
      FieldReader r(frame.metadata, "a refusal");
      std::string type = r.str();
      std::string message = r.str();
      r.end();
      fail("the peer refused the connection: " + message);
      return;
    }
    if (frame.type != ControlType::kHandshakeAck) {
      throw ProtocolError(
          std::string("expected HANDSHAKE_ACK, got ") +
          owner.types.name(frame.type));
    }
    accept_ack(frame);
    return;
  }
  if (state == State::kAwaitingProof) {
    if (frame.type != ControlType::kProof) {
      throw ProtocolError(
          std::string("expected PROOF, got ") + owner.types.name(frame.type));
    }
    accept_proof(frame);
    return;
  }
  if (frame.type == ControlType::kLaneHello) {
    attach_as_lane(frame);
    return;
  }
  if (frame.type != ControlType::kHandshake) {
    throw ProtocolError(
        std::string("expected HANDSHAKE, got ") + owner.types.name(frame.type));
  }
  accept_hello(frame);
}

void Connection::accept_hello(Frame& frame) {
  FieldReader r(frame.metadata, "a handshake");
  int id = r.i32();
  std::string name = r.str();
  uint32_t features = r.u32();
  std::string nonce = checked_nonce(r);
  bool has_token = r.u32() != 0;
  r.end();
  peer_id = id;
  peer_name = name;
  if (!refusal.empty()) {
    refuse("this worker " + refusal, refusal);
    return;
  }
  if (!owner.options.token.empty() && !has_token) {
    refuse("it presented no token", kTokenRequired + "none was presented");
    return;
  }
  if (std::string why = owner.identity_problem(id, name, *this); !why.empty()) {
    refuse(
        why, kTokenRequired + "it is not the worker it claims to be: " + why);
    return;
  }
  session = {nonce, auth::nonce(), id, owner.options.self_id};
  offered_shm = local && (features & kFeatureSharedMemory) != 0;
  set_state(State::kAwaitingProof);
  decoder.admit_one();
  send(Message{
      ControlType::kHandshakeAck,
      0,
      FieldWriter()
          .i32(owner.options.self_id)
          .str(owner.options.self_name)
          .u32(offered_shm ? kFeatureSharedMemory : uint32_t{0})
          .str(session.callee_nonce)
          .str(auth::proof(secret(), auth::Role::kCallee, session))
          .take(),
      {}});
}

void Connection::accept_proof(Frame& frame) {
  FieldReader r(frame.metadata, "a proof");
  std::string proof = r.str();
  r.end();
  if (!auth::verify(secret(), auth::Role::kCaller, session, proof)) {
    refuse("its token is wrong", kTokenRequired + "this one is wrong");
    return;
  }
  handshake_seq = ++owner.handshakes;
  handle.peer_ = peer_id;
  choose_path(offered_shm);
  authenticated();
}

void Connection::accept_ack(Frame& frame) {
  FieldReader r(frame.metadata, "a handshake ack");
  int id = r.i32();
  std::string name = r.str();
  uint32_t features = r.u32();
  std::string nonce = checked_nonce(r);
  std::string proof = r.str();
  r.end();
  if (id != peer_id) {
    throw ProtocolError(
        "connected to worker " + std::to_string(peer_id) +
        " but the peer says it is worker " + std::to_string(id) + " (" +
        printable(name) + ")");
  }
  session.callee_nonce = nonce;
  if (!auth::verify(secret(), auth::Role::kCallee, session, proof)) {
    // Nothing of the layer above was sent: the secret and the requests
    // stay here.
    fail(
        owner.peer_label(peer_id) +
        " could not prove that it holds the group's token (" +
        (owner.options.token.empty() ? "it has one, and this worker has none"
                                     : "it has none, or another one") +
        "; RpcBackendOptions::token or TIDE_RPC_TOKEN): nothing was sent "
        "to it");
    return;
  }
  authenticated();
  choose_path(local && (features & kFeatureSharedMemory) != 0);
  {
    std::unique_lock lock(wmutex);
    queue_locked(Message{
        ControlType::kProof,
        0,
        FieldWriter()
            .str(auth::proof(secret(), auth::Role::kCaller, session))
            .take(),
        {}});
    // What the layer above sent meanwhile goes now, encoded for the
    // transport the pair agreed on.
    holding = false;
    while (!held.empty()) {
      Message m = std::move(held.front());
      held.pop_front();
      held_bytes -= message_bytes(m);
      try {
        queue_locked(std::move(m));
      } catch (const std::exception& e) {
        fail_later(
            std::string("a queued message could not be sent: ") + e.what());
        return;
      }
    }
    flush(lock);
  }
}

void Connection::authenticated() {
  set_state(State::kOpen);
  decoder.trust_lengths();
  decoder.open();
  handshake_timer.cancel();
  owner.left_handshake(*this);
  grow_read_buffer();
}

void Connection::refuse(const std::string& logged, const std::string& told) {
  TIDE_LOG_WARN(
      "[{}] refused a connection from '{}' (id {}): {}",
      owner.options.self_name,
      printable(peer_name),  // the stranger's words
      peer_id,
      logged);
  Message answer{
      ControlType::kRefused,
      0,
      FieldWriter()
          .str("AuthenticationError")
          .str("worker '" + owner.options.self_name + "' " + told)
          .take(),
      {}};
  set_state(State::kRefused);
  std::unique_lock lock(wmutex);
  close_when_drained = true;
  queue_locked(std::move(answer));
  flush(lock);
}

void Connection::attach_as_lane(Frame& frame) {
  FieldReader r(frame.metadata, "a lane hello");
  int id = r.i32();
  uint32_t index = r.u32();
  std::string proof = r.str();
  r.end();
  if (!refusal.empty()) {
    throw ProtocolError("a lane to a worker that " + refusal);
  }
  if (local || index >= kMaxLanes) {
    throw ProtocolError(
        "lane " + std::to_string(index) + " of worker " + std::to_string(id) +
        (local ? " on a local socket" : ", over the limit of lanes"));
  }
  // The caller's connection whose session the proof is of: only its two
  // ends saw that session's nonces, and only holders of the token can key
  // the proof. (An older connection of the same worker may be a dead
  // process's that has not closed yet.)
  std::shared_ptr<Connection> p;
  for (const auto& c : owner.incoming) {
    if (c->state == State::kOpen && !c->local && !c->lane && c->peer_id == id &&
        auth::verify(
            c->secret(), auth::Role::kLane, c->session, proof, index)) {
      p = c;
      break;
    }
  }
  if (!p) {
    throw ProtocolError(
        "lane " + std::to_string(index) + " of worker " + std::to_string(id) +
        ", whose proof matches no TCP connection of that worker here");
  }
  LanePath::of(*p).attach(shared_from_this(), index);
  parent = p;
  peer_id = id;
  lane = true;
  handshake_timer.cancel();
  owner.left_handshake(*this);
  set_state(State::kLane);
  // Placed before the bytes that came with the hello are parsed.
  LanePath::read_in_place(*this);
  decoder.open();
  grow_read_buffer();
}

}  // namespace tide::transport
