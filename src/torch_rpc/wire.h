#pragma once

#include <torch/csrc/distributed/rpc/message.h>

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

constexpr transport::MessageType kTorchRequest = transport::kFirstUpperType;
constexpr transport::MessageType kTorchResponse = kTorchRequest + 1;

transport::MessageTypes torch_message_types();

// Encodes `message` (whose id is set). Throws c10::Error for a tensor that
// is not on the CPU.
transport::Message to_wire(
    const c10::intrusive_ptr<torch::distributed::rpc::Message>& message);

// Decodes a received message. Throws ProtocolError when it is malformed (a
// short header, a type that does not match the frame's, a pickle that does
// not parse, a tensor larger than its bytes).
c10::intrusive_ptr<torch::distributed::rpc::Message> from_wire(
    transport::Message m);

// A worker's entry in the rendezvous store ("tide/workers/<rank>"): its
// name and where it listens, as length-prefixed fields.
std::string encode_worker_entry(const transport::PeerAddress& address);
// Throws std::runtime_error for an entry that does not parse.
transport::PeerAddress decode_worker_entry(int rank, const std::string& entry);

}  // namespace tide::torch_rpc
