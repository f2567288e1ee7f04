#include "transport/buffer_path.h"

#include <algorithm>
#include <string>

#include "tide/common/error.h"

namespace tide::transport {

bool BufferPath::worth_placing(const Message& m, size_t threshold) {
  return m.buffers.size() > 1 && m.buffers.size() < FrameLimits{}.max_buffers &&
         std::any_of(
             m.buffers.begin() + 1,
             m.buffers.end(),
             [threshold](const Buffer& b) { return b.size() >= threshold; });
}

void BufferPath::check_limits(const Message& m) {
  (void)encode_head({m.type, 0, m.id, m.metadata, m.buffers});
}

void BufferPath::refuse_tables(const Frame& frame, const char* path) {
  if ((frame.flags & kFlagSharedMemory) != 0) {
    throw ProtocolError(
        std::string("a shared-memory frame on a connection whose buffers "
                    "travel ") +
        path);
  }
  if ((frame.flags & kFlagLanes) != 0) {
    throw ProtocolError(
        std::string("a lanes frame on a connection whose buffers travel ") +
        path);
  }
}

std::vector<Buffer> InlinePath::take(Frame& frame) {
  refuse_tables(frame, "inline");
  return std::move(frame.buffers);
}

}  // namespace tide::transport
