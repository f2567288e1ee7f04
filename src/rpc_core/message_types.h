#pragma once

#include "transport/frame.h"

// Every message type above the transport's own, in one table for the tree.
// The transport numbers its control messages 0x01-0x0f
// (transport/control.h); each rpc front end sends the types below and gives
// its transport only those, so a peer of one kind sending the other's is
// dropped. docs/rpc-protocol.md lists them all with their fields.
namespace tide::rpc_core {

struct MessageType {
  enum : transport::MessageType {
    // The C++ rpc agent (layouts: src/rpc/messages.h).
    kRequest = 0x10,
    kResponse = 0x11,
    kError = 0x12,
    kCancel = 0x13,
    // 0x20 was RREF_CREATE, now a REQUEST (tide.rref.create): not reused.
    // The torch backend's agent (layout: src/torch_rpc/wire.h).
    kTorchRequest = 0x30,
    kTorchResponse = 0x31,
  };
};

// The types the C++ rpc agent sends and takes, with their names.
inline const transport::MessageTypes& cpp_message_types() {
  static const transport::MessageTypes kTypes{
      {MessageType::kRequest, "REQUEST"},
      {MessageType::kResponse, "RESPONSE"},
      {MessageType::kError, "ERROR"},
      {MessageType::kCancel, "CANCEL"},
  };
  return kTypes;
}

// The types the torch backend's agent sends and takes.
inline const transport::MessageTypes& torch_message_types() {
  static const transport::MessageTypes kTypes{
      {MessageType::kTorchRequest, "TORCH_REQUEST"},
      {MessageType::kTorchResponse, "TORCH_RESPONSE"},
  };
  return kTypes;
}

}  // namespace tide::rpc_core
