#pragma once

#include <string>

#include "rpc_core/message_types.h"
#include "transport/frame.h"

// The C++ rpc agent's messages, carried by the transport (which knows only
// its own control messages, 0x01-0x0f).
//
// type               id                   metadata (transport/fields.h) and
//                                         buffers
// REQUEST            new                  function, timeout ms i64; the
//                                         argument stream, then its
//                                         out-of-band buffers
// RESPONSE           the request's        empty; the result, then its
//                                         out-of-band buffers
// ERROR              the request's        exception type, message
// CANCEL             the request's        the caller gave up; ignored
//
// Every RRef message (creation, fetch, fork request, child accept, user
// delete, proxy calls) is a REQUEST of a function every agent registers
// ("tide.rref.*", src/rpc/rrefs.h); so are distributed autograd's
// ("tide.autograd.*", src/autograd/dist_autograd.cpp), whose context
// travels at the head of a call's arguments (tag kAutograd, tide/rpc/stream.h).
//
// A "new" id is unique among the sender's outstanding requests; replies
// carry it back.
namespace tide::rpc::detail {

// The numbers are the registry's (rpc_core/message_types.h).
using MessageType = rpc_core::MessageType;

inline const transport::MessageTypes& rpc_message_types() {
  return rpc_core::cpp_message_types();
}

}  // namespace tide::rpc::detail
