#pragma once

#include "transport/frame.h"

// The transport's own messages, 0x01-0x0f. They never reach the layer
// above. (0x03-0x05 are kept for a shutdown handshake and pings.) The
// handshake proves each side to the other (transport/auth.h) and never
// carries the group's token.
//
// type             direction                metadata (transport/fields.h)
// HANDSHAKE        caller -> callee, first  caller id i32, caller name,
//                                           features u32, nonce, has a
//                                           token u32 (0 or 1)
// HANDSHAKE_ACK    callee -> caller, first  callee id i32, callee name,
//                                           features u32, nonce, proof
// PROOF            caller -> callee, second proof; the caller's messages
//                                           follow it
// REFUSED          callee -> caller         reason type, message; the callee
//                                           closes after it
// BUFFER_RELEASE   either way               segment ids (u64 list)
// LANE_HELLO       caller -> callee, first  caller id i32, lane index u32,
//                  on a lane                proof (of the lane's connection)
// BUFFER_PART      either way, on a lane;   part index u32, parts u32,
//                  id: the transfer         total bytes u64; one buffer
namespace tide::transport {

struct ControlType {
  enum : MessageType {
    kHandshake = 0x01,
    kHandshakeAck = 0x02,
    kBufferRelease = 0x06,
    kLaneHello = 0x07,
    kBufferPart = 0x08,
    kRefused = 0x09,
    kProof = 0x0a,
  };
};

// The control types and their names.
inline const MessageTypes& control_types() {
  static const MessageTypes kTypes{
      {ControlType::kHandshake, "HANDSHAKE"},
      {ControlType::kHandshakeAck, "HANDSHAKE_ACK"},
      {ControlType::kBufferRelease, "BUFFER_RELEASE"},
      {ControlType::kLaneHello, "LANE_HELLO"},
      {ControlType::kBufferPart, "BUFFER_PART"},
      {ControlType::kRefused, "REFUSED"},
      {ControlType::kProof, "PROOF"},
  };
  return kTypes;
}

// Handshake features.
constexpr uint32_t kFeatureSharedMemory = 1;

}  // namespace tide::transport
