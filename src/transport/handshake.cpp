// The first frame of a connection, each way: HANDSHAKE and its ack (or
// REFUSED), or LANE_HELLO for a lane. Who the peer is, whether it has the
// group's token, and whether the pair uses shared memory is settled here.
#include <string>

#include <asio/post.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "transport/connection.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/transport_impl.h"

namespace tide::transport {

std::string Transport::Impl::handshake_metadata(bool offer_shm) const {
  return FieldWriter()
      .i32(options.self_id)
      .str(options.self_name)
      .u32(offer_shm ? kFeatureSharedMemory : uint32_t{0})
      .str(options.token)
      .take();
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

void Connection::accept_ack(Frame& frame) {
  FieldReader r(frame.metadata, "a handshake ack");
  int id = r.i32();
  std::string name = r.str();
  uint32_t features = r.u32();
  r.end();
  if (id != peer_id) {
    throw ProtocolError(
        "connected to worker " + std::to_string(peer_id) +
        " but the peer says it is worker " + std::to_string(id) + " (" +
        printable(name) + ")");
  }
  set_state(State::kOpen);
  decoder.trust_lengths();
  {
    std::lock_guard lock(wmutex);
    shm = local && (features & kFeatureSharedMemory) != 0;
  }
  if (lanes_wanted.load()) {
    owner.open_lanes(shared_from_this());
  }
}

void Connection::accept_hello(Frame& frame) {
  FieldReader r(frame.metadata, "a handshake");
  int id = r.i32();
  std::string name = r.str();
  uint32_t features = r.u32();
  std::string token = r.str();
  r.end();
  if (!owner.options.token.empty() &&
      !token_equal(token, owner.options.token)) {
    refuse(name, id, token.empty());
    return;
  }
  set_state(State::kOpen);
  handshake_seq = ++owner.handshakes;
  decoder.trust_lengths();
  peer_id = id;
  handle.peer_ = id;
  bool agreed = local && (features & kFeatureSharedMemory) != 0;
  send(Message{
      ControlType::kHandshakeAck,
      0,
      FieldWriter()
          .i32(owner.options.self_id)
          .str(owner.options.self_name)
          .u32(agreed ? kFeatureSharedMemory : uint32_t{0})
          .take(),
      {}});
  std::lock_guard lock(wmutex);
  shm = agreed;
}

void Connection::refuse(const std::string& name, int id, bool no_token) {
  TIDE_LOG_WARN(
      "[{}] refused a connection from '{}' (id {}): {}",
      owner.options.self_name,
      printable(name),  // the stranger's words
      id,
      no_token ? "it presented no token" : "its token is wrong");
  Message refusal{
      ControlType::kRefused,
      0,
      FieldWriter()
          .str("AuthenticationError")
          .str(
              "worker '" + owner.options.self_name +
              "' requires the group's token (RpcBackendOptions::token or "
              "TIDE_RPC_TOKEN) and " +
              (no_token ? "none was presented" : "this one is wrong"))
          .take(),
      {}};
  set_state(State::kRefused);
  std::unique_lock lock(wmutex);
  close_when_drained = true;
  queue.push_back(encode_frame(std::move(refusal)));
  flush(lock);
}

void Connection::attach_as_lane(Frame& frame) {
  FieldReader r(frame.metadata, "a lane hello");
  int id = r.i32();
  uint32_t index = r.u32();
  std::string token = r.str();
  r.end();
  if (!owner.options.token.empty() &&
      !token_equal(token, owner.options.token)) {
    throw ProtocolError("a lane without the group's token");
  }
  // The caller's newest connection (an older one may be a dead process's
  // that has not closed yet).
  std::shared_ptr<Connection> p;
  for (const auto& c : owner.incoming) {
    if (c->state == State::kOpen && !c->local && c->peer_id == id &&
        (!p || c->handshake_seq > p->handshake_seq)) {
      p = c;
    }
  }
  if (local || !p) {
    throw ProtocolError(
        "lane " + std::to_string(index) + " of worker " + std::to_string(id) +
        ", which has no TCP connection here");
  }
  {
    std::lock_guard lock(p->wmutex);
    if (p->lanes.size() >= kMaxLanes) {
      throw ProtocolError("more than " + std::to_string(kMaxLanes) + " lanes");
    }
    p->lanes.push_back(shared_from_this());
  }
  parent = p;
  peer_id = id;
  lane = true;
  set_state(State::kLane);
  read_parts_in_place();
}

}  // namespace tide::transport
