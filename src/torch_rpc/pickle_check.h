#pragma once

#include <string_view>

// A walk over a pickle's opcodes (protocols 0-5) before torch's unpickler
// sees it: every length the pickle claims (a string's, a frame's) must fit
// in the bytes that came, every memo index must be one the pickle has put
// (or the next), and every opcode must be one pickle defines. torch's
// Unpickler trusts those fields and allocates what they claim first (14
// bytes naming memo entry 16 million cost 264 MB), so a peer's pickle is
// held to them here. Pure; no libtorch.
namespace tide::torch_rpc {

// Throws ProtocolError naming the offending opcode and its offset.
void check_pickle(std::string_view pickle);

}  // namespace tide::torch_rpc
