#include "transport/tcp/lane_path.h"

#include <algorithm>
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
LanePath::PartPlace check_part(const Frame& frame, uint64_t length) {
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
    LanePath::Transfer& t, const LanePath::PartPlace& part, uint64_t id) {
  if (t.got[part.index]) {
    throw ProtocolError(
        "part " + std::to_string(part.index) + " of transfer " +
        std::to_string(id) + " came twice");
  }
  t.got[part.index] = true;
}

}  // namespace

LanePath& LanePath::of(Connection& parent) {
  // Lanes attach only to a TCP connection that is open, whose path is this.
  return static_cast<LanePath&>(*parent.path);
}

uint16_t LanePath::place(Message& m, std::vector<int>& /*fds*/) {
  if (!worth_placing(m, kLaneThreshold)) {
    return 0;
  }
  if (lanes_.empty()) {
    want();
    return 0;
  }
  check_limits(m);
  m.buffers.emplace_back(place_on_lanes(m));
  return kFlagLanes;
}

bool LanePath::park(Frame& frame) {
  if ((frame.flags & kFlagLanes) == 0 || parts_in(frame)) {
    return false;
  }
  constexpr size_t kMaxParked = 4096;
  if (parked_.size() >= kMaxParked) {
    throw ProtocolError(
        "more than " + std::to_string(kMaxParked) +
        " frames waiting for their parts");
  }
  parked_.push_back(std::move(frame));
  return true;
}

void LanePath::want() {
  if (!conn_.outgoing || conn_.owner.options.lanes == 0 ||
      wanted_.exchange(true)) {
    return;
  }
  // The path lives as long as its connection.
  asio::post(conn_.owner.loop.io(), [this, conn = conn_.shared_from_this()] {
    if (conn->state == Connection::State::kOpen) {
      open();
    }
  });
}

void LanePath::attach(const std::shared_ptr<Connection>& lane, uint32_t index) {
  std::lock_guard lock(conn_.wmutex);
  if ((indices_ & (1u << index)) != 0) {
    throw ProtocolError(
        "a second lane " + std::to_string(index) + " of worker " +
        std::to_string(conn_.peer_id));
  }
  indices_ |= 1u << index;
  lanes_.push_back(lane);
}

bool LanePath::has(const std::shared_ptr<Connection>& lane) {
  std::lock_guard lock(conn_.wmutex);
  return std::find(lanes_.begin(), lanes_.end(), lane) != lanes_.end();
}

void LanePath::close() {
  std::vector<std::shared_ptr<Connection>> up;
  {
    std::lock_guard lock(conn_.wmutex);
    up.swap(lanes_);
  }
  for (const auto& lane : up) {
    lane->fail("its connection closed");
  }
  for (const auto& lane : std::exchange(opened_lanes_, {})) {
    lane->fail("its connection closed");
  }
}

bool LanePath::parts_in(const Frame& frame) const {
  for (const LaneRef& ref : lane_table(frame)) {
    auto it = transfers_.find(ref.transfer);
    if (it == transfers_.end() || it->second.have < it->second.parts) {
      return false;
    }
  }
  return true;
}

void LanePath::on_lane_frame(Connection& lane, Frame& frame) {
  if (frame.type != ControlType::kBufferPart) {
    throw ProtocolError(
        std::string("unexpected ") + lane.owner.types.name(frame.type) +
        " on a lane");
  }
  auto p = lane.parent.lock();
  if (p && p->state != Connection::State::kClosed) {
    of(*p).take_part(frame);
  }
}

LanePath::Transfer& LanePath::transfer_for(uint64_t id, const PartPlace& part) {
  auto [it, fresh] = transfers_.try_emplace(id);
  Transfer& t = it->second;
  if (fresh) {
    if (transfer_bytes_ + part.total > kMaxTransferBytes) {
      transfers_.erase(it);
      throw ProtocolError(
          "the peer's unfinished transfers would pass " +
          std::to_string(kMaxTransferBytes >> 30) + " GiB");
    }
    t.buffer = allocate_buffer(part.total);
    t.parts = part.parts;
    t.got.assign(part.parts, false);
    transfer_bytes_ += part.total;
  } else if (t.parts != part.parts || t.buffer.size() != part.total) {
    throw ProtocolError(
        "a part of transfer " + std::to_string(id) +
        " that does not fit its other parts");
  }
  return t;
}

// Where a lane's decoder reads a part: straight into its place in the
// transfer.
Buffer LanePath::place_part(const Frame& frame, uint64_t length) {
  PartPlace part = check_part(frame, length);
  Transfer& t = transfer_for(frame.id, part);
  claim(t, part, frame.id);
  return Buffer(t.buffer.owner(), t.buffer.data() + part.at, length);
}

// A part is in: copied to its place unless it was read there; frames whose
// parts are all in go on.
void LanePath::take_part(Frame& frame) {
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

void LanePath::dispatch_parked() {
  for (size_t i = 0; i < parked_.size();) {
    if (!parts_in(parked_[i])) {
      ++i;
      continue;
    }
    Frame f = std::move(parked_[i]);
    parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(i));
    conn_.dispatch(f);
    if (conn_.state == Connection::State::kClosed) {
      return;
    }
  }
}

void LanePath::read_in_place(Connection& lane) {
  lane.decoder.trust_lengths();
  // Empty: the decoder's own buffer, for what on_lane_frame rejects.
  lane.decoder.set_placement(
      [&lane](const Frame& frame, size_t index, uint64_t length) {
        auto p = lane.parent.lock();
        if (frame.type != ControlType::kBufferPart || index != 0 || !p ||
            p->state == Connection::State::kClosed) {
          return Buffer();
        }
        return of(*p).place_part(frame, length);
      });
}

std::vector<Buffer> LanePath::take(Frame& frame) {
  if ((frame.flags & kFlagSharedMemory) != 0) {
    refuse_tables(frame, "over lanes");
  }
  std::vector<Buffer> out;
  if ((frame.flags & kFlagLanes) == 0) {
    out = std::move(frame.buffers);
  } else {
    out = take_lane_buffers(frame);
  }
  if (std::any_of(out.begin(), out.end(), [](const Buffer& b) {
        return b.size() >= kLaneThreshold;
      })) {
    want();
  }
  return out;
}

std::vector<Buffer> LanePath::take_lane_buffers(Frame& frame) {
  std::vector<LaneRef> refs = lane_table(frame);
  frame.buffers.pop_back();
  std::vector<Buffer> out = std::move(frame.buffers);
  for (const LaneRef& ref : refs) {
    auto it = transfers_.find(ref.transfer);
    if (it == transfers_.end() || it->second.have < it->second.parts ||
        it->second.parts != ref.parts ||
        it->second.buffer.size() != ref.length) {
      throw ProtocolError(
          "buffer " + std::to_string(ref.index) + " is transfer " +
          std::to_string(ref.transfer) + ", whose parts do not make it");
    }
    out[ref.index] = std::move(it->second.buffer);
    transfer_bytes_ -= ref.length;
    transfers_.erase(it);
  }
  return out;
}

// Cuts the buffers of m that are large enough into one part per lane and
// sends the parts; returns their table. Holds wmutex (a lane's is taken
// under it, never the other way).
std::string LanePath::place_on_lanes(Message& m) {
  std::string table;
  auto parts = static_cast<uint32_t>(lanes_.size());
  for (size_t i = 1; i < m.buffers.size(); ++i) {
    const Buffer& b = m.buffers[i];
    if (b.size() < kLaneThreshold) {
      continue;
    }
    LaneRef ref{static_cast<uint32_t>(i), parts, next_transfer_++, b.size()};
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
      lanes_[j]->send(std::move(part));
    }
    table.append(reinterpret_cast<const char*>(&ref), sizeof ref);
    conn_.owner.buffers_via_lanes.fetch_add(1, std::memory_order_relaxed);
    conn_.owner.bytes_via_lanes.fetch_add(b.size(), std::memory_order_relaxed);
    m.buffers[i] = Buffer();
  }
  return table;
}

void LanePath::open() {
  // Once, for a TCP connection that is up (asked for from another thread,
  // want() may meet the ack here).
  if (opened_ || conn_.state != Connection::State::kOpen) {
    return;
  }
  opened_ = true;
  Transport::Impl& owner = conn_.owner;
  auto parent = conn_.shared_from_this();
  for (uint32_t j = 0; j < owner.options.lanes; ++j) {
    auto lane = std::make_shared<Connection>(
        owner, Socket(owner.loop.io()), true, false);
    opened_lanes_.push_back(lane);
    lane->peer_id = conn_.peer_id;
    lane->lane = true;
    lane->parent = parent;
    // Parts come from the first frame on: no handshake limits.
    lane->decoder = FrameDecoder(owner.types, FrameLimits{});
    read_in_place(*lane);
    lane->send(Message{
        ControlType::kLaneHello,
        0,
        FieldWriter()
            .i32(owner.options.self_id)
            .u32(j)
            .str(auth::proof(
                conn_.secret(), auth::Role::kLane, conn_.session, j))
            .take(),
        {}});
    // Used once connected: a lane that cannot connect is left out.
    owner.connect_tcp(lane, [this, parent, lane] {
      if (parent->state == Connection::State::kClosed) {
        lane->fail("its connection closed");
        return;
      }
      std::lock_guard lock(parent->wmutex);
      lanes_.push_back(lane);
    });
  }
}

}  // namespace tide::transport
