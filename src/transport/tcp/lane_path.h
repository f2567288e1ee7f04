#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/buffer_path.h"

// Lanes: a TCP connection's large buffers cut into parts and sent over
// several more TCP connections at once (BUFFER_PART), put together by the
// receiver in place. The caller's side opens them when the first buffer of
// kLaneThreshold bytes or more crosses, either way; a frame whose buffers
// went over lanes carries a lane table and waits for its parts
// (docs/rpc-protocol.md#lanes). A lane is a Connection of its own, in state
// kLane, whose parts go to its connection's LanePath.
namespace tide::transport {

class LanePath final : public BufferPath {
 public:
  using BufferPath::BufferPath;

  // The path of a TCP connection (`parent` of a lane).
  static LanePath& of(Connection& parent);

  uint16_t place(Message& m, std::vector<int>& fds) override;
  bool park(Frame& frame) override;
  std::vector<Buffer> take(Frame& frame) override;
  // Fails its lanes.
  void close() override;

  // The caller's side opens the lanes the first time a large buffer
  // crosses, either way. Any thread.
  void want();
  // The callee's side: `lane` says (LANE_HELLO, proved) that it is lane
  // `index` of this connection. Loop; ProtocolError for a second one.
  void attach(const std::shared_ptr<Connection>& lane, uint32_t index);
  // Whether `lane` carries this connection's parts (its loss loses them).
  bool has(const std::shared_ptr<Connection>& lane);

  // A lane's side: its decoder reads each part straight into its place in
  // the transfer; what it reads goes to its connection's path. Loop.
  static void read_in_place(Connection& lane);
  static void on_lane_frame(Connection& lane, Frame& frame);

  // A buffer coming in parts over lanes: its bytes, allocated whole at the
  // first part, and which parts are in.
  struct Transfer {
    Buffer buffer;
    uint32_t parts = 0;
    uint32_t have = 0;
    std::vector<bool> got;  // Claimed: read into place, or copied there.
  };
  struct PartPlace {
    uint32_t index = 0;
    uint32_t parts = 0;
    uint64_t total = 0;
    uint64_t at = 0;
  };

 private:
  // Opens options.lanes lanes, once, for a TCP connection that is open.
  // Loop.
  void open();
  bool parts_in(const Frame& frame) const;
  Transfer& transfer_for(uint64_t id, const PartPlace& part);
  Buffer place_part(const Frame& frame, uint64_t length);
  void take_part(Frame& frame);
  void dispatch_parked();
  std::vector<Buffer> take_lane_buffers(Frame& frame);
  // Cuts the large buffers of m into one part per lane and sends the
  // parts; returns their table. Holding wmutex (a lane's is taken under
  // it, never the other way).
  std::string place_on_lanes(Message& m);

  // Guarded by the connection's wmutex: the lanes up, and (callee) the
  // indices attached so far, a bit each.
  std::vector<std::shared_ptr<Connection>> lanes_;
  uint32_t indices_ = 0;
  uint64_t next_transfer_ = 1;
  // The caller's side: lanes asked for (any thread) and opened (loop).
  // Each happens once.
  std::atomic<bool> wanted_{false};
  bool opened_ = false;
  // Every lane it opened, connected or not (loop only): closed with it.
  std::vector<std::shared_ptr<Connection>> opened_lanes_;
  // Buffers coming in parts (loop only), by transfer id, and frames that
  // wait for theirs.
  std::unordered_map<uint64_t, Transfer> transfers_;
  uint64_t transfer_bytes_ = 0;
  std::deque<Frame> parked_;
};

}  // namespace tide::transport
