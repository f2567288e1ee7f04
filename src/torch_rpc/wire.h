#pragma once

#include <torch/csrc/distributed/rpc/message.h>

#include "rpc_core/message_types.h"
#include "transport/transport.h"

// A torch rpc Message as a message of tide's transport (docs/rpc-protocol.md,
// "torch messages"):
//
//   type      kTorchRequest or kTorchResponse (torch's type says which)
//   id        the request's id, echoed by its response
//   metadata  u32 torch message type, little-endian; then, when the message
//             has tensors, torch's pickle of the list of them, its storages
//             named "0", "1", ... in order
//   buffers   [0] the payload; [1 + i] storage i's bytes
//
// The payload and the storages are not copied: the buffers hold the message
// and the tensors alive until the transport wrote them. On receipt, tensors
// are made on the received buffers (their own storage), after a check that
// each fits the bytes that came.
namespace tide::torch_rpc {

constexpr transport::MessageType kTorchRequest =
    rpc_core::MessageType::kTorchRequest;
constexpr transport::MessageType kTorchResponse =
    rpc_core::MessageType::kTorchResponse;
using rpc_core::torch_message_types;

// Encodes `message` (whose id is set). Throws c10::Error for a tensor that
// is not on the CPU.
transport::Message to_wire(
    const c10::intrusive_ptr<torch::distributed::rpc::Message>& message);

// Decodes a received message. Throws ProtocolError when it is malformed (a
// short header, a type that does not match the frame's, a pickle that does
// not parse, a tensor larger than its bytes).
c10::intrusive_ptr<torch::distributed::rpc::Message> from_wire(
    transport::Message m);

}  // namespace tide::torch_rpc
