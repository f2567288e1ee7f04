#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "transport/buffer_path.h"
#include "transport/shm/segments.h"

// Buffers through shared memory on a Unix-socket connection: a frame with
// kFlagSharedMemory carries, as its last buffer, a table saying which of
// its (empty) buffers live where; the sender copied them into segments it
// passes once; the receiver leases them and gives each segment back
// (BUFFER_RELEASE) when the last buffer in it dies (docs/rpc-protocol.md).
namespace tide::transport {

struct ShmRef;

class ShmPath final : public BufferPath {
 public:
  using BufferPath::BufferPath;

  uint16_t place(Message& m, std::vector<int>& fds) override;
  std::vector<Buffer> take(Frame& frame) override;
  // BUFFER_RELEASE: segments the peer is done with.
  bool on_control(Frame& frame) override;

  // A buffer in segment `id` died (SegmentUse): this side's own segment
  // (`own`, sent back to it) is free again, the peer's is released to it.
  // Loop.
  void segment_done(uint64_t id, bool own);

 private:
  Buffer own_segment(const ShmRef& ref);
  // The peer's segment a buffer being sent lies in (a buffer it sent,
  // sent back), with the segment's size. Holding wmutex.
  std::optional<std::pair<uint64_t, size_t>> returned_segment(const Buffer& b);
  // Copies the large buffers of m into segments; returns their table.
  // Holding wmutex.
  std::string place_in_segments(Message& m, std::vector<int>& fds);
  // Tells the peer it may reuse its segment `id`, batched. Loop.
  void release_later(uint64_t id);

  // Guarded by the connection's wmutex.
  shm::SendSegments segments_;
  // The peer's segments mapped here, and those leased to buffers here (a
  // sender looks for the buffers it sends back among them).
  shm::Mappings mappings_;
  std::unordered_set<uint64_t> leased_;
  uint64_t mapped_bytes_ = 0;
  // Releases to send (loop only).
  std::vector<uint64_t> releases_;
};

}  // namespace tide::transport
