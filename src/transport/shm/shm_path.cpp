#include "transport/shm/shm_path.h"

#include <cstring>
#include <thread>

#include <asio/post.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "transport/connection.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/transport_impl.h"

namespace tide::transport {

// One entry of a frame's shared-memory table: buffer `index` is `length`
// bytes at the start of segment `segment` (`segment_size` bytes), which is
// the sender's (passed before, or with this frame) or the receiver's own
// (a buffer it sent, sent back as it was).
enum SegmentKind : uint32_t {
  kSendersKnown = 0,
  kSendersWithFd = 1,
  kReceivers = 2,
};
struct ShmRef {
  uint32_t index = 0;
  uint32_t kind = kSendersKnown;
  uint64_t segment = 0;
  uint64_t segment_size = 0;
  uint64_t length = 0;
};
static_assert(sizeof(ShmRef) == 32);

namespace {

// The peer's segments one connection maps, at most: what it may have in
// flight towards us.
constexpr uint64_t kMaxMappedBytes = uint64_t{16} << 30;

// memcpy, in two halves on two threads when large: one core's copy does not
// use all of the memory bandwidth (the copy is the shared-memory transport's
// one cost per byte).
void copy_in_parallel(char* to, const char* from, size_t n) {
  constexpr size_t kSplitAbove = size_t{8} << 20;
  if (n < kSplitAbove) {
    std::memcpy(to, from, n);
    return;
  }
  size_t half = n / 2;
  std::jthread other([=] { std::memcpy(to + half, from + half, n - half); });
  std::memcpy(to, from, half);
}

}  // namespace

uint16_t ShmPath::place(Message& m, std::vector<int>& fds) {
  if (!worth_placing(m, kShmThreshold)) {
    return 0;
  }
  check_limits(m);
  std::string table = place_in_segments(m, fds);
  if (table.empty()) {
    return 0;
  }
  m.buffers.emplace_back(std::move(table));
  return kFlagSharedMemory;
}

std::vector<Buffer> ShmPath::take(Frame& frame) {
  if ((frame.flags & kFlagLanes) != 0) {
    refuse_tables(frame, "through shared memory");
  }
  std::string table;
  if ((frame.flags & kFlagSharedMemory) != 0) {
    if (frame.buffers.empty()) {
      throw ProtocolError("a shared-memory frame without its table");
    }
    table = std::string(frame.buffers.back().view());
    frame.buffers.pop_back();
  }
  std::vector<Buffer> out = std::move(frame.buffers);
  if (table.size() % sizeof(ShmRef) != 0) {
    throw ProtocolError(
        "a shared-memory table of " + std::to_string(table.size()) +
        " bytes (entries are " + std::to_string(sizeof(ShmRef)) + ")");
  }
  std::vector<bool> placed(out.size(), false);
  for (size_t at = 0; at < table.size(); at += sizeof(ShmRef)) {
    ShmRef ref;
    std::memcpy(&ref, table.data() + at, sizeof ref);
    if (ref.index == 0 || ref.index >= out.size() || placed[ref.index] ||
        out[ref.index].size() != 0) {
      throw ProtocolError(
          "a shared-memory reference to buffer " + std::to_string(ref.index) +
          " of " + std::to_string(out.size()) + " that cannot take one");
    }
    if (ref.kind == kReceivers) {
      out[ref.index] = own_segment(ref);
      placed[ref.index] = true;
      continue;
    }
    std::shared_ptr<shm::Mapping> mapping;
    if (ref.segment_size != shm::segment_size_for(ref.length) ||
        ref.length > FrameLimits{}.max_buffer) {
      throw ProtocolError(
          "a shared-memory reference to a segment of " +
          std::to_string(ref.segment_size) + " bytes for " +
          std::to_string(ref.length) +
          " (segments are the power of two that fits, 1 MiB at least)");
    }
    std::lock_guard lock(conn_.wmutex);
    if (ref.kind == kSendersWithFd) {
      if (mapped_bytes_ + ref.segment_size > kMaxMappedBytes) {
        throw ProtocolError(
            "the peer's shared-memory segments would pass " +
            std::to_string(kMaxMappedBytes >> 30) + " GiB");
      }
      if (conn_.received_fds.empty()) {
        throw ProtocolError(
            "a shared-memory reference whose descriptor did not come");
      }
      Fd fd = std::move(conn_.received_fds.front());
      conn_.received_fds.pop_front();
      mapping = std::make_shared<shm::Mapping>(std::move(fd), ref.segment_size);
      if (!mappings_.emplace(ref.segment, mapping).second) {
        throw ProtocolError(
            "the peer passed shared-memory segment " +
            std::to_string(ref.segment) + " twice");
      }
      mapped_bytes_ += ref.segment_size;
    } else if (auto it = mappings_.find(ref.segment);
               ref.kind == kSendersKnown && it != mappings_.end()) {
      mapping = it->second;
    } else {
      throw ProtocolError(
          "a reference to shared-memory segment " +
          std::to_string(ref.segment) + ", which the peer never passed");
    }
    if (ref.length > mapping->size() || ref.segment_size != mapping->size() ||
        !leased_.insert(ref.segment).second) {
      throw ProtocolError(
          "a reference to shared-memory segment " +
          std::to_string(ref.segment) +
          " that does not fit it or that is still in use");
    }
    auto lease = std::make_shared<SegmentUse>(
        mapping,
        conn_.owner.weak_from_this(),
        conn_.weak_from_this(),
        ref.segment,
        false);
    out[ref.index] = Buffer(lease, mapping->base(), ref.length);
    placed[ref.index] = true;
  }
  return out;
}

Buffer ShmPath::own_segment(const ShmRef& ref) {
  std::lock_guard lock(conn_.wmutex);
  shm::Segment* seg = segments_.hold_local(ref.segment);
  if (seg == nullptr || ref.segment_size != seg->size ||
      ref.length > seg->size) {
    if (seg != nullptr) {
      segments_.drop_local(ref.segment);
    }
    throw ProtocolError(
        "a reference to shared-memory segment " + std::to_string(ref.segment) +
        " of this side's, which the peer does not hold or that does not fit");
  }
  auto hold = std::make_shared<SegmentUse>(
      seg->memory,
      conn_.owner.weak_from_this(),
      conn_.weak_from_this(),
      ref.segment,
      true);
  return Buffer(hold, seg->base, ref.length);
}

std::optional<std::pair<uint64_t, size_t>> ShmPath::returned_segment(
    const Buffer& b) {
  for (uint64_t id : leased_) {
    const auto& m = mappings_.at(id);
    if (b.data() == m->base() && b.size() <= m->size()) {
      return std::pair{id, m->size()};
    }
  }
  return std::nullopt;
}

std::string ShmPath::place_in_segments(Message& m, std::vector<int>& fds) {
  std::string table;
  for (size_t i = 1; i < m.buffers.size(); ++i) {
    Buffer& b = m.buffers[i];
    if (b.size() < kShmThreshold || fds.size() == kMaxFdsPerFrame) {
      continue;
    }
    if (auto back = returned_segment(b)) {
      // The peer's own bytes, unchanged or changed in place: no copy.
      ShmRef ref{
          static_cast<uint32_t>(i),
          kReceivers,
          back->first,
          back->second,
          b.size()};
      table.append(reinterpret_cast<const char*>(&ref), sizeof ref);
      conn_.owner.buffers_returned += 1;
      b = Buffer();
      continue;
    }
    shm::Segment* seg = nullptr;
    size_t before = segments_.count();
    try {
      seg = &segments_.acquire(b.size());
    } catch (const NetworkError& e) {
      TIDE_LOG_WARN(
          "[{}] sending {} bytes to worker {} through the socket: {}",
          conn_.owner.options.self_name,
          b.size(),
          conn_.peer_id,
          e.what());
      continue;
    }
    conn_.owner.segments += segments_.count() - before;
    copy_in_parallel(seg->base, b.data(), b.size());
    ShmRef ref{
        static_cast<uint32_t>(i),
        seg->peer_has_fd ? kSendersKnown : kSendersWithFd,
        seg->id,
        seg->size,
        b.size()};
    if (!seg->peer_has_fd) {
      fds.push_back(seg->fd.get());
      seg->peer_has_fd = true;
    }
    table.append(reinterpret_cast<const char*>(&ref), sizeof ref);
    conn_.owner.buffers_via_shm += 1;
    conn_.owner.bytes_via_shm += b.size();
    b = Buffer();
  }
  return table;
}

bool ShmPath::on_control(Frame& frame) {
  if (frame.type != ControlType::kBufferRelease) {
    return false;
  }
  FieldReader r(frame.metadata, "a release");
  std::vector<uint64_t> ids = r.u64s();
  r.end();
  std::lock_guard lock(conn_.wmutex);
  for (uint64_t id : ids) {
    if (!segments_.release(id)) {
      throw ProtocolError(
          "the peer released shared-memory segment " + std::to_string(id) +
          ", which it did not hold");
    }
  }
  return true;
}

void ShmPath::segment_done(uint64_t id, bool own) {
  std::lock_guard lock(conn_.wmutex);
  if (own) {
    segments_.drop_local(id);
  } else if (
      conn_.state != Connection::State::kClosed && leased_.erase(id) > 0) {
    release_later(id);
  }
}

void ShmPath::release_later(uint64_t id) {
  releases_.push_back(id);
  if (releases_.size() > 1) {
    return;  // A send is scheduled already.
  }
  // The path lives as long as its connection.
  asio::post(conn_.owner.loop.io(), [this, conn = conn_.shared_from_this()] {
    if (conn->state == Connection::State::kClosed) {
      return;
    }
    conn->send(Message{
        ControlType::kBufferRelease,
        0,
        FieldWriter().u64s(std::exchange(releases_, {})).take(),
        {}});
  });
}

SegmentUse::~SegmentUse() {
  // Through the loop: this may run anywhere, even under the connection's
  // lock.
  if (auto t = transport.lock()) {
    asio::post(t->loop.io(), [conn = conn, segment = segment, own = own] {
      if (auto c = conn.lock()) {
        // A lease exists only on a connection whose path is shared memory.
        static_cast<ShmPath&>(*c->path).segment_done(segment, own);
      }
    });
  }
}

}  // namespace tide::transport
