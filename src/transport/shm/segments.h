#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>

#include "tide/common/fd.h"

// Shared-memory segments for the RPC transport between processes of one
// host: a sender copies a large buffer into a segment (a sealed memfd) and
// passes the segment's descriptor over the Unix socket once; the receiver
// maps it and hands the mapping out as the buffer's bytes, so the data is
// copied once, by the sender, and a received tensor lives in the segment.
// The receiver gives a segment back (kBufferRelease) when the last buffer
// in it dies, and the sender reuses it: segments are mapped and faulted in
// once per connection, not once per message.
namespace tide::transport::shm {

// Segments are sized in powers of two from this, so a segment fits any
// buffer of its class.
constexpr size_t kMinSegment = size_t{1} << 20;

// The smallest segment size that holds n bytes.
size_t segment_size_for(size_t n);

// A segment this side created and sends through.
struct Segment {
  uint64_t id = 0;
  Fd fd;
  char* base = nullptr;
  size_t size = 0;
  // The mapping: unmapped when the last holder (the pool, or a buffer that
  // lives in the segment) lets go.
  std::shared_ptr<char> memory;
  // The peer has the descriptor (it was passed with an earlier frame).
  bool peer_has_fd = false;
};

// The segments of one connection's sending side. Not thread safe (the
// transport's loop owns it).
class SendSegments {
 public:
  SendSegments() = default;
  SendSegments(const SendSegments&) = delete;
  SendSegments& operator=(const SendSegments&) = delete;

  // A free segment of at least n bytes, held by the peer; a new one when
  // none is free. Throws NetworkError when the memory cannot be had (the
  // caller then sends the bytes through the socket).
  Segment& acquire(size_t n);
  // The peer is done with segment `id`; returns false for an id the peer
  // does not hold (a confused peer).
  bool release(uint64_t id);

  // The peer sent segment `id` back (a buffer it received in it, returned
  // as it was): this side holds it too until drop_local(), and it stays in
  // use until both are done. Null when the peer does not hold `id`.
  Segment* hold_local(uint64_t id);
  void drop_local(uint64_t id);

  // Segments created, and their bytes; for stats.
  size_t count() const {
    return segments_.size();
  }
  size_t bytes() const {
    return bytes_;
  }

 private:
  std::unordered_map<uint64_t, Segment> segments_;
  std::multimap<size_t, uint64_t> free_;  // size -> id
  // Who uses a segment: the peer (until its release), and buffers of this
  // side that the peer sent back in it. Free when neither.
  struct Use {
    bool peer = false;
    int local = 0;
  };
  void free_if_unused(uint64_t id, const Use& use);
  std::unordered_map<uint64_t, Use> in_use_;
  uint64_t next_id_ = 1;
  size_t bytes_ = 0;
};

// A segment this side mapped from a descriptor the peer passed.
class Mapping {
 public:
  // Maps fd (closed once mapped) after checking that it is a
  // sealed memfd of exactly `size` bytes, so the peer can neither shrink it
  // under us nor make us map less than it claims; its pages are faulted in
  // as they are read, not ahead. Throws ProtocolError.
  Mapping(Fd fd, size_t size);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  char* base() const {
    return base_;
  }
  size_t size() const {
    return size_;
  }

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
};

// The peer's segments this side has mapped, by the peer's id.
using Mappings = std::unordered_map<uint64_t, std::shared_ptr<Mapping>>;

}  // namespace tide::transport::shm
