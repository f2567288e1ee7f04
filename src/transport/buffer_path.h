#pragma once

#include <cstdint>
#include <vector>

#include "transport/frame.h"
#include "transport/transport.h"

// How a connection's large buffers travel. A connection does the socket's
// I/O and the handshake; it holds one buffer path, chosen at the handshake
// (Connection::choose_path), which decides where the buffers of a message
// go and takes them back on the other side:
//
//   InlinePath  every buffer in the socket's stream: before the handshake,
//               on a lane, and on a Unix socket without shared memory
//   ShmPath     buffers of kShmThreshold bytes or more copied into shared
//               memory segments (shm/shm_path.h): a Unix socket whose two
//               sides agreed to it
//   LanePath    buffers of kLaneThreshold bytes or more cut into parts over
//               the connection's lanes, more TCP connections beside it
//               (tcp/lane_path.h): any TCP connection
//
// A frame whose buffers took a path carries that path's flag and, as its
// last buffer, the table saying where they went (docs/rpc-protocol.md).
namespace tide::transport {

struct Connection;

class BufferPath {
 public:
  explicit BufferPath(Connection& conn) : conn_(conn) {}
  virtual ~BufferPath() = default;
  BufferPath(const BufferPath&) = delete;
  BufferPath& operator=(const BufferPath&) = delete;

  // Sending, on any thread, holding the connection's wmutex: moves the
  // large buffers of m (past its first) out of the stream, appends their
  // table to m.buffers and what descriptors must go with the frame to
  // `fds`, and returns the frame's flag; 0 when every buffer stays in the
  // stream. Throws InvalidArgument for a message over the frame limits
  // before it takes anything.
  virtual uint16_t place(Message& m, std::vector<int>& fds) = 0;

  // Receiving, on the loop: keeps a frame whose buffers are still on their
  // way and dispatches it (Connection::dispatch) once they are all in;
  // false when they are here.
  virtual bool park(Frame& /*frame*/) {
    return false;
  }
  // Receiving, on the loop: the frame's buffers, with those that took this
  // path put back in place. Throws ProtocolError for a table it cannot
  // take (another path's included).
  virtual std::vector<Buffer> take(Frame& frame) = 0;
  // A control frame of the path's own (BUFFER_RELEASE), on the loop; false
  // for any other.
  virtual bool on_control(Frame& /*frame*/) {
    return false;
  }
  // The connection is closing, on the loop, before the transport hears of
  // it.
  virtual void close() {}

 protected:
  // Whether m has a buffer past its first of `threshold` bytes or more, and
  // room for a table.
  static bool worth_placing(const Message& m, size_t threshold);
  // Throws InvalidArgument when m is over the frame limits (as encoding it
  // would): a frame they refuse must not take segments or lanes.
  static void check_limits(const Message& m);
  // Refuses a frame that carries a table of any path.
  static void refuse_tables(const Frame& frame, const char* path);

  Connection& conn_;
};

class InlinePath final : public BufferPath {
 public:
  using BufferPath::BufferPath;
  uint16_t place(Message& /*m*/, std::vector<int>& /*fds*/) override {
    return 0;
  }
  std::vector<Buffer> take(Frame& frame) override;
};

}  // namespace tide::transport
