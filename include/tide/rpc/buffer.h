#pragma once

#include "tide/common/buffer.h"

namespace tide::rpc {

// The rpc API names them here too.
using tide::Buffer;
using tide::Payload;

}  // namespace tide::rpc
