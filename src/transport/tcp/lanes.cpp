// Lanes: a TCP connection's large buffers cut into parts and sent over
// several more TCP connections at once (BUFFER_PART), put together by the
// receiver in place. The caller's side opens them when the first buffer of
// kLaneThreshold bytes or more crosses, either way; a frame whose buffers
// went over lanes carries a lane table and waits for its parts
// (docs/rpc-protocol.md#lanes).
#include <cstring>

#include <asio/post.hpp>

#include "tide/common/error.h"

#include "transport/auth.h"
#include "transport/connection.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/transport_impl.h"

namespace tide::transport {

namespace {

// An entry of a lane table (kFlagLanes): buffer `index` of the frame is the
// transfer whose `parts` parts come on the lanes.
struct LaneRef {
  uint32_t index = 0;
  uint32_t parts = 0;
  uint64_t transfer = 0;
  uint64_t length = 0;
};
static_assert(sizeof(LaneRef) == 24);
// Bytes of transfers a connection holds before their frame takes them.
constexpr uint64_t kMaxTransferBytes = uint64_t{16} << 30;

// Bytes of each part of a buffer of `total` bytes cut into `parts` (the
// last may be shorter).
uint64_t part_size(uint64_t total, uint32_t parts) {
  return (total + parts - 1) / parts;
}

// The table of a kFlagLanes frame (its last buffer), checked against the
// frame: each entry names an empty buffer of its own past the first, of a
// length and part count that a sender can make.
std::vector<LaneRef> lane_table(const Frame& frame) {
  if (frame.buffers.empty() ||
      frame.buffers.back().size() % sizeof(LaneRef) != 0) {
    throw ProtocolError("a lanes frame without a whole table");
  }
  std::string_view table = frame.buffers.back().view();
  std::vector<LaneRef> refs(table.size() / sizeof(LaneRef));
  std::memcpy(refs.data(), table.data(), table.size());
  size_t n = frame.buffers.size() - 1;
  std::vector<bool> named(n, false);
  for (const LaneRef& ref : refs) {
    if (ref.index == 0 || ref.index >= n || named[ref.index] ||
        frame.buffers[ref.index].size() != 0 || ref.parts == 0 ||
        ref.parts > kMaxLanes || ref.length < kLaneThreshold ||
        ref.length > FrameLimits{}.max_buffer) {
      throw ProtocolError(
          "a lane reference to buffer " + std::to_string(ref.index) + " of " +
          std::to_string(n) + " that cannot take one");
    }
    named[ref.index] = true;
  }
  return refs;
}

// A part's place in its transfer, from its metadata, checked against what
// a sender can make.
Connection::PartPlace check_part(const Frame& frame, uint64_t length) {
  FieldReader r(frame.metadata, "a part");
  uint32_t index = r.u32();
  uint32_t parts = r.u32();
  uint64_t total = r.u64();
  r.end();
  uint64_t chunk = parts == 0 ? 0 : part_size(total, parts);
  uint64_t at = uint64_t{index} * chunk;
  if (parts == 0 || parts > kMaxLanes || index >= parts ||
      total < kLaneThreshold || total > FrameLimits{}.max_buffer ||
      at >= total || length != std::min(chunk, total - at)) {
    throw ProtocolError(
        "a part " + std::to_string(index) + " of " + std::to_string(parts) +
        " of " + std::to_string(total) + " bytes that cannot be");
  }
  return {index, parts, total, at};
}

void claim(
    Connection::Transfer& t, const Connection::PartPlace& part, uint64_t id) {
  if (t.got[part.index]) {
    throw ProtocolError(
        "part " + std::to_string(part.index) + " of transfer " +
        std::to_string(id) + " came twice");
  }
  t.got[part.index] = true;
}

}  // namespace

void Connection::want_lanes() {
  if (!outgoing || lane || owner.options.lanes == 0 ||
      lanes_wanted.exchange(true)) {
    return;
  }
  asio::post(owner.loop.io(), [self = shared_from_this()] {
    if (self->state == State::kOpen) {
      self->owner.open_lanes(self);
    }
  });
}

bool Connection::parts_in(const Frame& frame) const {
  for (const LaneRef& ref : lane_table(frame)) {
    auto it = transfers.find(ref.transfer);
    if (it == transfers.end() || it->second.have < it->second.parts) {
      return false;
    }
  }
  return true;
}

void Connection::on_part(Frame& frame) {
  if (frame.type != ControlType::kBufferPart) {
    throw ProtocolError(
        std::string("unexpected ") + owner.types.name(frame.type) +
        " on a lane");
  }
  auto p = parent.lock();
  if (p && p->state != State::kClosed) {
    p->take_part(frame);
  }
}

Connection::Transfer& Connection::transfer_for(
    uint64_t id, const PartPlace& part) {
  auto [it, fresh] = transfers.try_emplace(id);
  Transfer& t = it->second;
  if (fresh) {
    if (transfer_bytes + part.total > kMaxTransferBytes) {
      transfers.erase(it);
      throw ProtocolError(
          "the peer's unfinished transfers would pass " +
          std::to_string(kMaxTransferBytes >> 30) + " GiB");
    }
    t.buffer = allocate_buffer(part.total);
    t.parts = part.parts;
    t.got.assign(part.parts, false);
    transfer_bytes += part.total;
  } else if (t.parts != part.parts || t.buffer.size() != part.total) {
    throw ProtocolError(
        "a part of transfer " + std::to_string(id) +
        " that does not fit its other parts");
  }
  return t;
}

// Where a lane's decoder reads a part: straight into its place in the
// transfer (empty: the decoder's own buffer, for what on_part rejects).
Buffer Connection::place_part(
    const Frame& frame, size_t index, uint64_t length) {
  auto p = parent.lock();
  if (frame.type != ControlType::kBufferPart || index != 0 || !p ||
      p->state == State::kClosed) {
    return {};
  }
  PartPlace part = check_part(frame, length);
  Transfer& t = p->transfer_for(frame.id, part);
  claim(t, part, frame.id);
  return Buffer(t.buffer.owner(), t.buffer.data() + part.at, length);
}

// A part is in: copied to its place unless it was read there; frames whose
// parts are all in go on.
void Connection::take_part(Frame& frame) {
  if (frame.buffers.size() != 1) {
    throw ProtocolError(
        "a part with " + std::to_string(frame.buffers.size()) + " buffers");
  }
  const Buffer& bytes = frame.buffers[0];
  PartPlace part = check_part(frame, bytes.size());
  Transfer& t = transfer_for(frame.id, part);
  if (bytes.data() != t.buffer.data() + part.at) {
    claim(t, part, frame.id);
    std::memcpy(t.buffer.data() + part.at, bytes.data(), bytes.size());
  }
  if (++t.have == t.parts) {
    dispatch_parked();
  }
}

void Connection::dispatch_parked() {
  for (size_t i = 0; i < parked.size();) {
    if (!parts_in(parked[i])) {
      ++i;
      continue;
    }
    Frame f = std::move(parked[i]);
    parked.erase(parked.begin() + static_cast<std::ptrdiff_t>(i));
    dispatch(f);
    if (state == State::kClosed) {
      return;
    }
  }
}

void Connection::read_parts_in_place() {
  decoder.trust_lengths();
  decoder.set_placement(
      [this](const Frame& frame, size_t index, uint64_t length) {
        return place_part(frame, index, length);
      });
}

std::vector<Buffer> Connection::take_lane_buffers(Frame& frame) {
  if ((frame.flags & kFlagSharedMemory) != 0) {
    throw ProtocolError("a frame with both a shared-memory and a lane table");
  }
  std::vector<LaneRef> refs = lane_table(frame);
  frame.buffers.pop_back();
  std::vector<Buffer> out = std::move(frame.buffers);
  for (const LaneRef& ref : refs) {
    auto it = transfers.find(ref.transfer);
    if (it == transfers.end() || it->second.have < it->second.parts ||
        it->second.parts != ref.parts ||
        it->second.buffer.size() != ref.length) {
      throw ProtocolError(
          "buffer " + std::to_string(ref.index) + " is transfer " +
          std::to_string(ref.transfer) + ", whose parts do not make it");
    }
    out[ref.index] = std::move(it->second.buffer);
    transfer_bytes -= ref.length;
    transfers.erase(it);
  }
  return out;
}

// Cuts the buffers of m that are large enough into one part per lane and
// sends the parts; returns their table. Holds wmutex (a lane's is taken
// under it, never the other way).
std::string Connection::place_on_lanes(Message& m) {
  std::string table;
  auto parts = static_cast<uint32_t>(lanes.size());
  for (size_t i = 1; i < m.buffers.size(); ++i) {
    const Buffer& b = m.buffers[i];
    if (b.size() < kLaneThreshold) {
      continue;
    }
    LaneRef ref{static_cast<uint32_t>(i), parts, next_transfer++, b.size()};
    uint64_t chunk = part_size(b.size(), parts);
    for (uint32_t j = 0; j < parts; ++j) {
      uint64_t at = uint64_t{j} * chunk;
      Message part{
          ControlType::kBufferPart,
          ref.transfer,
          FieldWriter().u32(j).u32(parts).u64(ref.length).take(),
          {}};
      part.buffers.emplace_back(
          b.owner(), b.data() + at, std::min(chunk, b.size() - at));
      lanes[j]->send(std::move(part));
    }
    table.append(reinterpret_cast<const char*>(&ref), sizeof ref);
    owner.buffers_via_lanes.fetch_add(1, std::memory_order_relaxed);
    owner.bytes_via_lanes.fetch_add(b.size(), std::memory_order_relaxed);
    m.buffers[i] = Buffer();
  }
  return table;
}

void Transport::Impl::open_lanes(const std::shared_ptr<Connection>& parent) {
  // Once, for a TCP connection that is up (asked for from another thread,
  // want_lanes() may meet the ack here).
  if (parent->lanes_opened || parent->state != Connection::State::kOpen ||
      parent->local) {
    return;
  }
  parent->lanes_opened = true;
  for (uint32_t j = 0; j < options.lanes; ++j) {
    auto lane =
        std::make_shared<Connection>(*this, Socket(loop.io()), true, false);
    parent->opened_lanes.push_back(lane);
    lane->peer_id = parent->peer_id;
    lane->lane = true;
    lane->parent = parent;
    // Parts come from the first frame on: no handshake limits.
    lane->decoder = FrameDecoder(types, FrameLimits{});
    lane->read_parts_in_place();
    lane->send(Message{
        ControlType::kLaneHello,
        0,
        FieldWriter()
            .i32(options.self_id)
            .u32(j)
            .str(auth::proof(
                options.token, auth::Role::kLane, parent->session, j))
            .take(),
        {}});
    // Used once connected: a lane that cannot connect is left out.
    connect_tcp(lane, [parent, lane] {
      if (parent->state == Connection::State::kClosed) {
        lane->fail("its connection closed");
        return;
      }
      std::lock_guard lock(parent->wmutex);
      parent->lanes.push_back(lane);
    });
  }
}

}  // namespace tide::transport
