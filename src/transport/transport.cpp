#include "transport/transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <asio.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "common/demangle.h"
#include "common/random.h"

#include "transport/fields.h"
#include "transport/frame.h"
#include "transport/shm/segments.h"

namespace tide::rpc::detail {

namespace {

using asio::ip::tcp;
using Socket = asio::generic::stream_protocol::socket;
using Endpoint = asio::generic::stream_protocol::endpoint;

// Per sendmsg: enough to batch many small frames; sendmsg takes up to
// IOV_MAX (1024).
constexpr size_t kMaxIov = 128;
// Descriptors one frame may pass (each new segment passes one); the kernel
// takes at most 253 per message.
constexpr size_t kMaxFdsPerFrame = 64;
constexpr size_t kReadBuffer = 256 * 1024;
// A handshake (or its refusal) is a few names: a peer not yet known sends
// no more before it is.
constexpr FrameLimits kHandshakeLimits{
    .max_metadata = 64 * 1024,
    .max_buffers = 0,
    .max_buffer = 0,
    .max_frame = 128 * 1024};
// The peer's segments one connection maps, at most: what it may have in
// flight towards us.
constexpr uint64_t kMaxMappedBytes = uint64_t{16} << 30;
// Reads before another connection gets the loop.
constexpr int kReadsPerTurn = 32;

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
// Frames waiting for their parts.
constexpr size_t kMaxParked = 4096;

// Bytes of each part of a buffer of `total` bytes cut into `parts` (the
// last may be shorter).
uint64_t part_size(uint64_t total, uint32_t parts) {
  return (total + parts - 1) / parts;
}

// The type and message of an exception, for an ERROR frame.
std::pair<std::string, std::string> describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return {type_name(ex), ex.what()};
  } catch (...) {
    return {"unknown", "a non-standard exception"};
  }
}

std::string errno_text(int e) {
  return std::strerror(e);
}

// A message to send: its buffers are the payload's stream, then the
// payload's buffers.
struct Message {
  MessageType type = MessageType::kRequest;
  uint64_t id = 0;
  std::string metadata;
  std::vector<Buffer> buffers;
};

Message payload_message(
    MessageType type, uint64_t id, std::string meta, Payload p) {
  Message m{type, id, std::move(meta), {}};
  m.buffers.reserve(1 + p.buffers.size());
  m.buffers.emplace_back(std::move(p.data));
  for (auto& b : p.buffers) {
    m.buffers.push_back(std::move(b));
  }
  return m;
}

// A frame on its way out: the head, then the buffers, straight from where
// they live (writev); fds go with its first byte.
struct OutFrame {
  std::string head;
  std::vector<Buffer> buffers;
  std::vector<int> fds;
  size_t total = 0;
};

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

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

// How long the loop, or a thread helping it, keeps polling after its last
// work before it sleeps: a reply on one host comes back sooner than a
// sleeping core wakes up, and a core that has just seen work is likely to
// see more.
constexpr auto kSpin = std::chrono::microseconds(50);

// Set on a thread while it runs the loop's handlers (the I/O thread always):
// help() there would wait on itself.
thread_local bool t_in_loop = false;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string local_host_key() {
  std::array<char, 128> ns{};
  ssize_t n = ::readlink("/proc/self/ns/net", ns.data(), ns.size() - 1);
  return read_first_line("/proc/sys/kernel/random/boot_id") + "/" +
         (n > 0 ? std::string(ns.data(), static_cast<size_t>(n)) : "?");
}

struct Connection;

struct Transport::Impl : std::enable_shared_from_this<Transport::Impl> {
  Impl(TransportOptions o, RequestHandler handler)
      : options(std::move(o)),
        on_request(std::move(handler)),
        work(asio::make_work_guard(io)),
        acceptor(io),
        local_acceptor(io) {}

  // A call waiting for its reply.
  using Clock = std::chrono::steady_clock;
  using Deadlines = std::multimap<Clock::time_point, uint64_t>;

  struct Pending {
    Promise<Payload> promise;
    int peer = 0;
    std::string fn;
    std::chrono::milliseconds timeout{0};
    Deadlines::iterator deadline;
  };

  void start_accept();
  void start_local_accept();
  void adopt(Socket socket, bool local);
  // Opens the connection to `to`, then send_call(). Loop only.
  void start_call_on_loop(
      uint64_t id,
      std::chrono::milliseconds timeout,
      Pending call,
      Payload args);
  // Registers the call on `conn` with its deadline and sends it. Any
  // thread.
  void send_call(
      const std::shared_ptr<Connection>& conn,
      uint64_t id,
      std::chrono::milliseconds timeout,
      Pending call,
      Payload args);
  std::shared_ptr<Connection> connect_on_loop(int to);
  // Connects conn over TCP and starts it, then runs `connected`.
  void connect_tcp(
      const std::shared_ptr<Connection>& conn,
      std::function<void()> connected = {});

  // Opens options.lanes lanes beside `parent`, a TCP connection whose
  // handshake is done; once (nothing for a local or closed one). Loop only.
  void open_lanes(const std::shared_ptr<Connection>& parent);
  // Removes call `id` from the books; nullopt when it completed already (a
  // late reply, a timer that lost the race). Any thread.
  std::optional<Pending> take_call(uint64_t id);
  // Fails the calls whose deadline passed; arms the timer for the next.
  // Loop only.
  void expire_calls();
  // Completes a call taken off the books. Any thread.
  void complete(
      Pending& call, std::optional<Payload> value, std::exception_ptr error);
  void connection_failed(Connection& conn, const std::string& reason);
  void stop_on_loop();
  std::string peer_label(int id) const;
  // HANDSHAKE's metadata: who this side is, shared memory offered or not,
  // and the token.
  std::string handshake_metadata(bool offer_shm) const {
    return FieldWriter()
        .i32(options.self_id)
        .str(options.self_name)
        .u32(offer_shm ? kFeatureSharedMemory : uint32_t{0})
        .str(options.token)
        .take();
  }
  // The I/O thread: runs the loop until it runs out of work.
  void run_loop();
  void help(const std::function<bool()>& done);
  // Runs the loop's ready handlers (only the first with `one`) on this
  // thread, which holds loop_mutex; logs a handler that threw (the loop's
  // own catch what they expect) and serves on.
  size_t poll_holding_loop(bool one);

  const TransportOptions options;
  RequestHandler on_request;
  const std::string host_key = local_host_key();
  std::string local_name;  // Without the leading NUL.

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  tcp::acceptor acceptor;
  asio::local::stream_protocol::acceptor local_acceptor;
  uint16_t port = 0;
  std::jthread thread;
  // Who runs the loop's handlers: the I/O thread, or a thread that waits
  // for the loop (help()). One at a time, whoever holds it.
  std::mutex loop_mutex;
  std::atomic<int> helpers{0};             // Threads in help().
  std::atomic<bool> loop_sleeping{false};  // The I/O thread waits in epoll.
  std::atomic<int64_t> last_work_ns{0};    // When a handler last ran.
  std::atomic<bool> stopping{false};
  std::atomic<size_t> pending_count{0};
  std::atomic<uint64_t> next_id{1};
  std::atomic<uint64_t> buffers_via_shm{0};
  std::atomic<uint64_t> bytes_via_shm{0};
  std::atomic<uint64_t> segments{0};
  std::atomic<uint64_t> buffers_returned{0};
  std::atomic<uint64_t> buffers_via_lanes{0};
  std::atomic<uint64_t> bytes_via_lanes{0};

  // Loop only.
  std::unordered_map<int, PeerAddress> peers;
  std::unordered_set<std::shared_ptr<Connection>> incoming;
  uint64_t handshakes = 0;  // Accepted so far.

  // The books of calls: a caller's thread registers and sends its call on an
  // open connection itself; the loop opens connections, completes calls and
  // fails them. Guarded by calls_mutex, with each Connection::calls.
  std::mutex calls_mutex;
  std::unordered_map<int, std::shared_ptr<Connection>> outgoing;
  std::unordered_map<uint64_t, Pending> pending;
  // One timer for every call: the deadlines in order, and when the timer is
  // set to fire (max: not set).
  Deadlines deadlines;
  Clock::time_point timer_at = Clock::time_point::max();
  bool stopped = false;
  asio::steady_timer deadline_timer{io};  // Loop only.
};

// A received buffer that lives in a shared-memory segment, which is the
// peer's (a lease: when the buffer dies, the peer may reuse the segment) or
// this side's own, sent back by the peer (reused here once the peer's
// release has come too).
struct SegmentUse {
  SegmentUse(
      std::shared_ptr<void> memory,
      std::weak_ptr<Transport::Impl> transport,
      std::weak_ptr<Connection> conn,
      uint64_t segment,
      bool own)
      : memory(std::move(memory)),
        transport(std::move(transport)),
        conn(std::move(conn)),
        segment(segment),
        own(own) {}
  ~SegmentUse();
  SegmentUse(const SegmentUse&) = delete;
  SegmentUse& operator=(const SegmentUse&) = delete;

  std::shared_ptr<void> memory;  // Keeps the mapping.
  std::weak_ptr<Transport::Impl> transport;
  std::weak_ptr<Connection> conn;
  uint64_t segment = 0;
  bool own = false;
};

// One connection, either way, over TCP or a Unix socket. Loop only.
struct Connection : std::enable_shared_from_this<Connection> {
  // A buffer coming in parts over lanes: its bytes, allocated whole at the
  // first part, and which parts are in.
  struct Transfer {
    Buffer buffer;
    uint32_t parts = 0;
    uint32_t have = 0;
    std::vector<bool> got;  // Claimed: read into place, or copied there.
  };

  Connection(Transport::Impl& owner, Socket socket, bool outgoing, bool local)
      : owner(owner),
        socket(std::move(socket)),
        outgoing(outgoing),
        local(local),
        decoder(FrameLimits{}, kHandshakeLimits),
        read_buf(kReadBuffer) {}

  ~Connection() {
    for (int fd : received_fds) {
      ::close(fd);
    }
  }

  // The socket is connected: start reading and writing.
  void start() {
    asio::error_code ignored;
    socket.non_blocking(true, ignored);
    if (!local) {
      int one = 1;
      ::setsockopt(
          socket.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    {
      std::unique_lock lock(wmutex);
      connected = true;
      flush(lock);
    }
    wait_readable();
  }

  void wait_readable() {
    socket.async_wait(
        Socket::wait_read,
        [self = shared_from_this()](const asio::error_code& ec) {
          if (self->closed) {
            return;
          }
          if (ec) {
            self->fail(ec.message());
            return;
          }
          self->read_ready();
        });
  }

  void read_ready() {
    for (int turn = 0; turn < kReadsPerTurn; ++turn) {
      // A large buffer in progress is read into its place; what follows it
      // into read_buf.
      std::span<char> direct;
      try {
        direct = decoder.window();
      } catch (const std::exception& e) {
        drop(e.what());
        return;
      }
      std::array<iovec, 2> iov{};
      size_t niov = 0;
      if (!direct.empty()) {
        iov[niov++] = {direct.data(), direct.size()};
      }
      iov[niov++] = {read_buf.data(), read_buf.size()};
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 253)> control;
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = niov;
      if (local) {
        msg.msg_control = control.data();
        msg.msg_controllen = control.size();
      }
      ssize_t k = ::recvmsg(
          socket.native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (k < 0) {
        int e = errno;
        if (e == EINTR) {
          continue;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
          wait_readable();
          return;
        }
        fail(errno_text(e));
        return;
      }
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
           c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < n; ++i) {
            int fd = 0;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            received_fds.push_back(fd);
          }
        }
      }
      if ((msg.msg_flags & MSG_CTRUNC) != 0 ||
          received_fds.size() > kMaxFdsPerFrame ||
          (!handshaken && !received_fds.empty())) {
        drop("protocol error: the peer passed descriptors it may not pass");
        return;
      }
      if (k == 0) {
        fail(
            decoder.mid_frame()
                ? "connection closed by the peer in the middle of a frame"
                : "connection closed by the peer");
        return;
      }
      try {
        size_t got = static_cast<size_t>(k);
        size_t placed = std::min(got, direct.size());
        if (placed > 0) {
          decoder.commit(placed);
        }
        decoder.feed(read_buf.data(), got - placed);
        while (auto frame = decoder.next()) {
          on_frame(std::move(*frame));
          if (closed) {
            return;
          }
        }
        // Descriptors come with their frame's first byte: between frames
        // none may be left over.
        if (!decoder.mid_frame() && !received_fds.empty()) {
          throw ProtocolError("descriptors that no frame's table claimed");
        }
        // A read short of what was offered took all there was (on a Unix
        // socket, unless it stopped at descriptors): wait instead of asking
        // again only to hear EAGAIN. (Arming the wait rechecks readiness,
        // EPOLL_CTL_MOD, so bytes that came meanwhile are not missed.)
        if (got < direct.size() + read_buf.size() && msg.msg_controllen == 0) {
          wait_readable();
          return;
        }
      } catch (const ProtocolError& e) {
        drop(std::string("protocol error: ") + e.what());
        return;
      } catch (const std::exception& e) {
        drop(e.what());
        return;
      }
    }
    // More may be waiting: read on after the others had their turn.
    asio::post(owner.io, [self = shared_from_this()] {
      if (!self->closed) {
        self->read_ready();
      }
    });
  }

  // Fails the connection after logging why (the peer misbehaved).
  void drop(const std::string& reason) {
    TIDE_LOG_WARN(
        "[{}] dropping connection with {}: {}",
        owner.options.self_name,
        owner.peer_label(peer_id),
        reason);
    fail(reason);
  }

  void on_frame(Frame frame) {
    if (refused) {
      return;  // What the peer sent after its refused handshake is moot.
    }
    if (!handshaken) {
      expect_handshake(frame);
      return;
    }
    if (is_lane) {
      on_part(frame);
      return;
    }
    if (frame.type == MessageType::kBufferRelease) {
      on_release(frame);
      return;
    }
    if ((frame.flags & kFlagLanes) != 0 && !parts_in(frame)) {
      if (parked.size() >= kMaxParked) {
        throw ProtocolError(
            "more than " + std::to_string(kMaxParked) +
            " frames waiting for their parts");
      }
      parked.push_back(std::move(frame));
      return;
    }
    dispatch(frame);
  }

  void dispatch(Frame& frame) {
    if (outgoing) {
      if (std::any_of(
              frame.buffers.begin(), frame.buffers.end(), [](const Buffer& b) {
                return b.size() >= kLaneThreshold;
              })) {
        want_lanes();
      }
      on_reply(frame);
    } else {
      on_request(frame);
    }
  }

  // The caller's side of a TCP connection opens its lanes when the first
  // buffer large enough for them crosses it, either way (a pair that never
  // moves one keeps one socket): now if the handshake is acknowledged (the
  // callee knows the connection then), else at the ack. Any thread.
  void want_lanes() {
    if (!outgoing || is_lane || owner.options.lanes == 0 ||
        lanes_wanted.exchange(true)) {
      return;
    }
    asio::post(owner.io, [self = shared_from_this()] {
      if (self->handshaken) {
        self->owner.open_lanes(self);
      }
    });
  }

  // The table of a kFlagLanes frame (its last buffer), checked against the
  // frame: each entry names an empty buffer of its own past the first, of a
  // length and part count that a sender can make.
  static std::vector<LaneRef> lane_table(const Frame& frame) {
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

  // Whether every part of every transfer the frame's table names is here.
  bool parts_in(const Frame& frame) const {
    for (const LaneRef& ref : lane_table(frame)) {
      auto it = transfers.find(ref.transfer);
      if (it == transfers.end() || it->second.have < it->second.parts) {
        return false;
      }
    }
    return true;
  }

  // A lane's frame: a part of one of its parent's transfers.
  void on_part(Frame& frame) {
    if (frame.type != MessageType::kBufferPart) {
      throw ProtocolError(
          std::string("unexpected ") + message_type_name(frame.type) +
          " on a lane");
    }
    auto p = parent.lock();
    if (p && !p->closed) {
      p->take_part(frame);
    }
  }

  // A part's place in its transfer, from its metadata, checked against
  // what a sender can make.
  struct PartPlace {
    uint32_t index = 0;
    uint32_t parts = 0;
    uint64_t total = 0;
    uint64_t at = 0;
  };
  static PartPlace check_part(const Frame& frame, uint64_t length) {
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

  // The transfer `id`, made (its whole buffer allocated) at its first part.
  Transfer& transfer_for(uint64_t id, const PartPlace& part) {
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

  static void claim(Transfer& t, const PartPlace& part, uint64_t id) {
    if (t.got[part.index]) {
      throw ProtocolError(
          "part " + std::to_string(part.index) + " of transfer " +
          std::to_string(id) + " came twice");
    }
    t.got[part.index] = true;
  }

  // Where a lane's decoder reads a part: straight into its place in the
  // transfer (empty: the decoder's own buffer, for what on_part rejects).
  Buffer place_part(const Frame& frame, size_t index, uint64_t length) {
    auto p = parent.lock();
    if (frame.type != MessageType::kBufferPart || index != 0 || !p ||
        p->closed) {
      return {};
    }
    PartPlace part = check_part(frame, length);
    Transfer& t = p->transfer_for(frame.id, part);
    claim(t, part, frame.id);
    return Buffer(t.buffer.owner(), t.buffer.data() + part.at, length);
  }

  // A part is in: copied to its place unless it was read there; frames
  // whose parts are all in go on.
  void take_part(Frame& frame) {
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

  void dispatch_parked() {
    for (size_t i = 0; i < parked.size();) {
      if (!parts_in(parked[i])) {
        ++i;
        continue;
      }
      Frame f = std::move(parked[i]);
      parked.erase(parked.begin() + static_cast<std::ptrdiff_t>(i));
      dispatch(f);
      if (closed) {
        return;
      }
    }
  }

  // Server side: the first frame of an accepted socket is LANE_HELLO; it
  // becomes a lane of the caller's connection.
  void attach_as_lane(Frame& frame) {
    FieldReader r(frame.metadata, "a lane hello");
    int id = r.i32();
    uint32_t index = r.u32();
    std::string token = r.str();
    r.end();
    if (!owner.options.token.empty() &&
        !token_equal(token, owner.options.token)) {
      throw ProtocolError("a lane without the group's token");
    }
    // The caller's newest connection (an older one may be a dead process's
    // that has not closed yet).
    std::shared_ptr<Connection> p;
    for (const auto& c : owner.incoming) {
      if (!c->is_lane && c->handshaken && !c->refused && !c->closed &&
          !c->local && c->peer_id == id &&
          (!p || c->handshake_seq > p->handshake_seq)) {
        p = c;
      }
    }
    if (local || !p) {
      throw ProtocolError(
          "lane " + std::to_string(index) + " of worker " + std::to_string(id) +
          ", which has no TCP connection here");
    }
    {
      std::lock_guard lock(p->wmutex);
      if (p->lanes.size() >= kMaxLanes) {
        throw ProtocolError(
            "more than " + std::to_string(kMaxLanes) + " lanes");
      }
      p->lanes.push_back(shared_from_this());
    }
    is_lane = true;
    attached = true;
    parent = p;
    peer_id = id;
    handshaken = true;
    read_parts_in_place();
  }

  // A lane's decoder reads parts straight into their transfers.
  void read_parts_in_place() {
    decoder.trust_lengths();
    decoder.set_placement(
        [this](const Frame& frame, size_t index, uint64_t length) {
          return place_part(frame, index, length);
        });
  }

  void expect_handshake(Frame& frame) {
    if (outgoing && frame.type == MessageType::kError) {
      FieldReader r(frame.metadata, "a refusal");
      std::string type = r.str();
      std::string message = r.str();
      r.end();
      fail("the peer refused the connection: " + message);
      return;
    }
    if (!outgoing && frame.type == MessageType::kLaneHello) {
      attach_as_lane(frame);
      return;
    }
    auto want = outgoing ? MessageType::kHandshakeAck : MessageType::kHandshake;
    if (frame.type != want) {
      throw ProtocolError(
          std::string("expected ") + message_type_name(want) + ", got " +
          message_type_name(frame.type));
    }
    if (outgoing) {
      FieldReader r(frame.metadata, "a handshake ack");
      int id = r.i32();
      std::string name = r.str();
      uint32_t features = r.u32();
      r.end();
      if (id != peer_id) {
        throw ProtocolError(
            "connected to worker " + std::to_string(peer_id) +
            " but the peer says it is worker " + std::to_string(id) + " (" +
            name + ")");
      }
      handshaken = true;
      decoder.trust_lengths();
      {
        std::lock_guard lock(wmutex);
        shm = local && (features & kFeatureSharedMemory) != 0;
      }
      if (lanes_wanted.load()) {
        owner.open_lanes(shared_from_this());
      }
      return;
    }
    FieldReader r(frame.metadata, "a handshake");
    int id = r.i32();
    std::string name = r.str();
    uint32_t features = r.u32();
    std::string token = r.str();
    r.end();
    if (!owner.options.token.empty() &&
        !token_equal(token, owner.options.token)) {
      TIDE_LOG_WARN(
          "[{}] refused a connection from '{}' (id {}): {}",
          owner.options.self_name,
          name,
          id,
          token.empty() ? "it presented no token" : "its token is wrong");
      Message refusal{MessageType::kError, 0, {}, {}};
      refusal.metadata =
          FieldWriter()
              .str("AuthenticationError")
              .str(
                  "worker '" + owner.options.self_name +
                  "' requires the group's token (RpcBackendOptions::token or "
                  "TIDE_RPC_TOKEN) and " +
                  (token.empty() ? "none was presented"
                                 : "this one is wrong"))
              .take();
      refused = true;
      std::unique_lock lock(wmutex);
      close_after_flush = true;
      queue.push_back(encode_frame(std::move(refusal)));
      flush(lock);
      return;
    }
    handshaken = true;
    handshake_seq = ++owner.handshakes;
    decoder.trust_lengths();
    peer_id = id;
    bool agreed = local && (features & kFeatureSharedMemory) != 0;
    Message ack{MessageType::kHandshakeAck, 0, {}, {}};
    ack.metadata = FieldWriter()
                       .i32(owner.options.self_id)
                       .str(owner.options.self_name)
                       .u32(agreed ? kFeatureSharedMemory : uint32_t{0})
                       .take();
    send(std::move(ack));
    std::lock_guard lock(wmutex);
    shm = agreed;
  }

  // The frame's buffers, the shared-memory ones placed (leased) per its
  // table.
  std::vector<Buffer> take_buffers(Frame& frame) {
    if ((frame.flags & kFlagLanes) != 0) {
      return take_lane_buffers(frame);
    }
    std::string table;
    if ((frame.flags & kFlagSharedMemory) != 0) {
      if (!shm) {
        throw ProtocolError(
            "a shared-memory frame on a connection without shared memory");
      }
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
      std::lock_guard lock(wmutex);
      if (ref.kind == kSendersWithFd) {
        if (mapped_bytes + ref.segment_size > kMaxMappedBytes) {
          throw ProtocolError(
              "the peer's shared-memory segments would pass " +
              std::to_string(kMaxMappedBytes >> 30) + " GiB");
        }
        if (received_fds.empty()) {
          throw ProtocolError(
              "a shared-memory reference whose descriptor did not come");
        }
        int fd = received_fds.front();
        received_fds.pop_front();
        mapping = std::make_shared<shm::Mapping>(fd, ref.segment_size);
        if (!mappings.emplace(ref.segment, mapping).second) {
          throw ProtocolError(
              "the peer passed shared-memory segment " +
              std::to_string(ref.segment) + " twice");
        }
        mapped_bytes += ref.segment_size;
      } else if (auto it = mappings.find(ref.segment);
                 ref.kind == kSendersKnown && it != mappings.end()) {
        mapping = it->second;
      } else {
        throw ProtocolError(
            "a reference to shared-memory segment " +
            std::to_string(ref.segment) + ", which the peer never passed");
      }
      if (ref.length > mapping->size() || ref.segment_size != mapping->size() ||
          !leased.insert(ref.segment).second) {
        throw ProtocolError(
            "a reference to shared-memory segment " +
            std::to_string(ref.segment) +
            " that does not fit it or that is still in use");
      }
      auto lease = std::make_shared<SegmentUse>(
          mapping,
          owner.weak_from_this(),
          weak_from_this(),
          ref.segment,
          false);
      out[ref.index] = Buffer(lease, mapping->base(), ref.length);
      placed[ref.index] = true;
    }
    return out;
  }

  // The frame's buffers, those its lane table names taken from their
  // finished transfers.
  std::vector<Buffer> take_lane_buffers(Frame& frame) {
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

  // A buffer the peer sent back in a segment of ours (kReceivers).
  Buffer own_segment(const ShmRef& ref) {
    std::lock_guard lock(wmutex);
    shm::Segment* seg = segments.hold_local(ref.segment);
    if (seg == nullptr || ref.segment_size != seg->size ||
        ref.length > seg->size) {
      if (seg != nullptr) {
        segments.drop_local(ref.segment);
      }
      throw ProtocolError(
          "a reference to shared-memory segment " +
          std::to_string(ref.segment) +
          " of this side's, which the peer does not hold or that does not "
          "fit");
    }
    auto hold = std::make_shared<SegmentUse>(
        seg->memory,
        owner.weak_from_this(),
        weak_from_this(),
        ref.segment,
        true);
    return Buffer(hold, seg->base, ref.length);
  }

  // The peer's segment that `b` is (a buffer received from the peer, sent
  // back whole), if any. Holds wmutex.
  std::optional<std::pair<uint64_t, size_t>> returned_segment(const Buffer& b) {
    for (uint64_t id : leased) {
      const auto& m = mappings.at(id);
      if (b.data() == m->base() && b.size() <= m->size()) {
        return std::pair{id, m->size()};
      }
    }
    return std::nullopt;
  }

  Payload take_payload(Frame& frame) {
    std::vector<Buffer> buffers = take_buffers(frame);
    if (buffers.empty()) {
      throw ProtocolError(
          std::string(message_type_name(frame.type)) +
          " frame without its payload buffer");
    }
    Payload p;
    p.data = std::move(buffers[0]);
    p.buffers.assign(
        std::make_move_iterator(buffers.begin() + 1),
        std::make_move_iterator(buffers.end()));
    return p;
  }

  void on_release(Frame& frame) {
    FieldReader r(frame.metadata, "a release");
    std::vector<uint64_t> ids = r.u64s();
    r.end();
    std::lock_guard lock(wmutex);
    for (uint64_t id : ids) {
      if (!segments.release(id)) {
        throw ProtocolError(
            "the peer released shared-memory segment " + std::to_string(id) +
            ", which it did not hold");
      }
    }
  }

  // A buffer in segment `id` died (SegmentUse). Loop only.
  void segment_done(uint64_t id, bool own) {
    std::lock_guard lock(wmutex);
    if (own) {
      segments.drop_local(id);
    } else if (!closed && leased.erase(id) > 0) {
      release_later(id);
    }
  }

  // Tells the peer it may reuse its segment `id`, batched. Loop only.
  void release_later(uint64_t id) {
    releases.push_back(id);
    if (releases.size() > 1) {
      return;  // A send is scheduled already.
    }
    asio::post(owner.io, [self = shared_from_this()] {
      if (self->closed) {
        return;
      }
      Message m{MessageType::kBufferRelease, 0, {}, {}};
      m.metadata = FieldWriter().u64s(std::exchange(self->releases, {})).take();
      self->send(std::move(m));
    });
  }

  void on_reply(Frame& frame) {
    switch (frame.type) {
      case MessageType::kResponse: {
        Payload p = take_payload(frame);
        if (auto call = owner.take_call(frame.id)) {
          owner.complete(*call, std::move(p), nullptr);
        }
        return;
      }
      case MessageType::kError: {
        FieldReader r(frame.metadata, "an error");
        std::string type = r.str();
        std::string message = r.str();
        r.end();
        if (auto call = owner.take_call(frame.id)) {
          owner.complete(
              *call,
              std::nullopt,
              std::make_exception_ptr(RemoteError(
                  call->fn + "() on " + owner.peer_label(peer_id) + " raised " +
                  type + ": " + message)));
        }
        return;
      }
      default:
        throw ProtocolError(
            std::string("unexpected ") + message_type_name(frame.type) +
            " from a callee");
    }
  }

  void on_request(Frame& frame) {
    if (frame.type == MessageType::kCancel) {
      return;  // Best effort: a running function is not interrupted.
    }
    if (frame.type != MessageType::kRequest) {
      throw ProtocolError(
          std::string("unexpected ") + message_type_name(frame.type) +
          " from a caller");
    }
    FieldReader r(frame.metadata, "a request");
    std::string fn = r.str();
    r.i64();  // the caller's timeout, in ms
    r.end();
    uint64_t id = frame.id;
    Payload args = take_payload(frame);
    Future<Payload> result = [&] {
      try {
        return owner.on_request(peer_id, fn, std::move(args));
      } catch (...) {
        return Future<Payload>::make_failed(std::current_exception());
      }
    }();
    std::weak_ptr<Connection> weak = weak_from_this();
    // An async function may complete after the transport is gone.
    std::weak_ptr<Transport::Impl> transport = owner.weak_from_this();
    // Completes on a worker thread (or inline here), which sends the reply
    // itself: no hop through the loop.
    result.on_complete([weak, transport, id](const Future<Payload>& f) {
      auto alive = transport.lock();
      auto self = weak.lock();
      if (!alive || !self) {
        return;  // The caller is gone; so is its interest in the reply.
      }
      auto send_error = [&](const std::exception_ptr& error) {
        auto [type, message] = describe(error);
        Message reply{MessageType::kError, id, {}, {}};
        reply.metadata = FieldWriter().str(type).str(message).take();
        self->send(std::move(reply));
      };
      if (auto error = f.error()) {
        send_error(error);
        return;
      }
      try {
        self->send(payload_message(
            MessageType::kResponse,
            id,
            {},
            f.wait(std::chrono::milliseconds(0))));
      } catch (...) {
        // A result the frame limits refuse: the caller hears why.
        send_error(std::current_exception());
      }
    });
  }

  // Cuts the buffers of m that are large enough into one part per lane and
  // sends the parts; returns their table. Holds wmutex (a lane's is taken
  // under it, never the other way).
  std::string place_on_lanes(Message& m) {
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
            MessageType::kBufferPart,
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

  // Moves the buffers of m that are large enough into shared-memory
  // segments; returns their table ("" for none) and the descriptors the
  // peer does not have yet.
  std::string place_in_segments(Message& m, std::vector<int>& fds) {
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
        owner.buffers_returned += 1;
        b = Buffer();
        continue;
      }
      shm::Segment* seg = nullptr;
      size_t before = segments.count();
      try {
        seg = &segments.acquire(b.size());
      } catch (const NetworkError& e) {
        TIDE_LOG_WARN(
            "[{}] sending {} bytes to worker {} through the socket: {}",
            owner.options.self_name,
            b.size(),
            peer_id,
            e.what());
        continue;
      }
      owner.segments += segments.count() - before;
      copy_in_parallel(seg->base, b.data(), b.size());
      ShmRef ref{
          static_cast<uint32_t>(i),
          seg->peer_has_fd ? kSendersKnown : kSendersWithFd,
          seg->id,
          seg->size,
          b.size()};
      if (!seg->peer_has_fd) {
        fds.push_back(seg->fd);
        seg->peer_has_fd = true;
      }
      table.append(reinterpret_cast<const char*>(&ref), sizeof ref);
      owner.buffers_via_shm += 1;
      owner.bytes_via_shm += b.size();
      b = Buffer();
    }
    return table;
  }

  // Queues a message and writes what the socket takes now. Any thread;
  // throws InvalidArgument when it is over the frame limits.
  void send(Message m) {
    std::unique_lock lock(wmutex);
    if (wclosed) {
      return;
    }
    queue.push_back(encode_frame(std::move(m)));
    flush(lock);
  }

  OutFrame encode_frame(Message m) {
    OutFrame out;
    uint16_t flags = 0;
    bool large = std::any_of(
        m.buffers.begin() + std::min<size_t>(1, m.buffers.size()),
        m.buffers.end(),
        [](const Buffer& b) { return b.size() >= kShmThreshold; });
    // With room for the table.
    if (shm && large && m.buffers.size() < FrameLimits{}.max_buffers) {
      // Checked against the limits as it is first (encode_head throws): a
      // frame the limits refuse must not take segments.
      (void)encode_head({m.type, 0, m.id, m.metadata, m.buffers});
      std::string table = place_in_segments(m, out.fds);
      if (!table.empty()) {
        flags |= kFlagSharedMemory;
        m.buffers.emplace_back(std::move(table));
      }
    } else if (
        !shm && m.buffers.size() < FrameLimits{}.max_buffers &&
        std::any_of(
            m.buffers.begin() + std::min<size_t>(1, m.buffers.size()),
            m.buffers.end(),
            [](const Buffer& b) { return b.size() >= kLaneThreshold; })) {
      if (lanes.empty()) {
        want_lanes();
      } else {
        (void)encode_head({m.type, 0, m.id, m.metadata, m.buffers});
        flags |= kFlagLanes;
        m.buffers.emplace_back(place_on_lanes(m));
      }
    }
    for (const auto& b : m.buffers) {
      out.total += b.size();
    }
    out.head = encode_head({m.type, flags, m.id, m.metadata, m.buffers});
    out.total += out.head.size();
    out.buffers = std::move(m.buffers);
    return out;
  }

  // Writes queued frames until none is left or the socket is full (then the
  // loop waits for it). Any thread, holding wmutex through `lock`. One
  // thread writes at a time, and without the lock: frames others queue
  // meanwhile go out with its next sendmsg, so a busy connection makes few
  // system calls.
  void flush(std::unique_lock<std::mutex>& lock) {
    if (flushing || writing || !connected) {
      return;
    }
    flushing = true;
    while (!queue.empty() && !wclosed) {
      std::array<iovec, kMaxIov> iov{};
      size_t n = 0;
      std::vector<int>* fds = nullptr;
      size_t skip = front_sent;
      auto add = [&](const char* p, size_t len) {
        if (skip >= len) {
          skip -= len;
          return;
        }
        if (n < kMaxIov) {
          iov[n++] = {const_cast<char*>(p + skip), len - skip};
        }
        skip = 0;
      };
      for (size_t q = 0; q < queue.size() && n < kMaxIov; ++q) {
        OutFrame& f = queue[q];
        if (!f.fds.empty()) {
          // Descriptors ride with their frame's first byte: it starts a
          // sendmsg of its own.
          if (q > 0) {
            break;
          }
          fds = &f.fds;
        }
        add(f.head.data(), f.head.size());
        for (const auto& b : f.buffers) {
          add(b.data(), b.size());
        }
      }
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = n;
      alignas(cmsghdr)
          std::array<char, CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)>
              control{};
      if (fds != nullptr) {
        size_t bytes = fds->size() * sizeof(int);
        msg.msg_control = control.data();
        msg.msg_controllen = CMSG_SPACE(bytes);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(bytes);
        std::memcpy(CMSG_DATA(c), fds->data(), bytes);
      }
      // The frames the iovecs point into stay: others only append to the
      // queue, and fail() leaves it to this writer.
      int fd = socket.native_handle();
      lock.unlock();
      ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      int e = errno;
      lock.lock();
      if (k < 0) {
        if (e == EINTR) {
          continue;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
          writing = true;
          asio::post(
              owner.io, [self = shared_from_this()] { self->wait_writable(); });
          break;
        }
        fail_later("write failed: " + errno_text(e));
        break;
      }
      if (fds != nullptr) {
        fds->clear();
      }
      auto left = static_cast<size_t>(k);
      while (left > 0) {
        size_t rest = queue.front().total - front_sent;
        if (left < rest) {
          front_sent += left;
          break;
        }
        left -= rest;
        queue.pop_front();
        front_sent = 0;
      }
    }
    flushing = false;
    if (wclosed) {
      queue.clear();
      if (close_deferred) {
        asio::post(
            owner.io, [self = shared_from_this()] { self->close_socket(); });
      }
    } else if (queue.empty() && close_after_flush) {
      fail_later("refused the peer");
    }
  }

  // Loop only.
  void wait_writable() {
    if (closed) {
      return;
    }
    socket.async_wait(
        Socket::wait_write,
        [self = shared_from_this()](const asio::error_code& ec) {
          if (self->closed) {
            return;
          }
          if (ec) {
            self->fail("write failed: " + ec.message());
            return;
          }
          std::unique_lock lock(self->wmutex);
          self->writing = false;
          self->flush(lock);
        });
  }

  // fail() on the loop; any thread, holding wmutex.
  void fail_later(std::string reason) {
    wclosed = true;  // Nothing more is written.
    asio::post(
        owner.io, [self = shared_from_this(), reason] { self->fail(reason); });
  }

  // Loop only.
  void fail(const std::string& reason) {
    if (closed) {
      return;
    }
    closed = true;
    std::vector<std::shared_ptr<Connection>> own_lanes;
    {
      std::lock_guard lock(wmutex);
      wclosed = true;
      own_lanes.swap(lanes);
    }
    close_socket();
    for (const auto& lane : own_lanes) {
      lane->fail("its connection closed");
    }
    for (const auto& lane : std::exchange(opened_lanes, {})) {
      lane->fail("its connection closed");
    }
    owner.connection_failed(*this, reason);
  }

  // Closes the socket, or has the writer close it (through the loop) when
  // one is in sendmsg: never under a writer, whose descriptor could be
  // reused. Loop only.
  void close_socket() {
    std::lock_guard lock(wmutex);
    asio::error_code ignored;
    socket.shutdown(Socket::shutdown_both, ignored);
    if (flushing) {
      close_deferred = true;
      return;
    }
    queue.clear();
    socket.close(ignored);
  }

  Transport::Impl& owner;
  Socket socket;
  const bool outgoing;
  // A Unix socket to a process of this host (tcp otherwise).
  bool local;
  int peer_id = -1;
  bool handshaken = false;
  uint64_t handshake_seq = 0;  // Callee's side: the order of handshakes.
  bool refused = false;
  bool closed = false;
  FrameDecoder decoder;
  std::vector<char> read_buf;
  // Descriptors received, not yet claimed by a frame's table.
  std::deque<int> received_fds;
  uint64_t mapped_bytes = 0;

  // The sending side: any thread writes under wmutex (a reply goes out from
  // the worker thread that made it), the loop waits for a full socket.
  std::mutex wmutex;
  // Shared-memory buffers agreed in the handshake.
  bool shm = false;
  bool connected = false;
  bool wclosed = false;
  bool writing = false;   // Waiting for the socket to take more.
  bool flushing = false;  // A thread is writing (without the lock).
  bool close_after_flush = false;
  bool close_deferred = false;
  std::deque<OutFrame> queue;
  size_t front_sent = 0;  // Bytes of queue.front() written.
  shm::SendSegments segments;
  // The peer's segments mapped here, and those leased to buffers here
  // (a sender looks for the buffers it sends back among them).
  shm::Mappings mappings;
  std::unordered_set<uint64_t> leased;
  // Releases to send (loop only).
  std::vector<uint64_t> releases;

  // Lanes (TCP): more connections beside this one, each carrying parts of
  // its large buffers (BUFFER_PART), both ways. Guarded by wmutex.
  std::vector<std::shared_ptr<Connection>> lanes;
  uint64_t next_transfer = 1;  // Guarded by wmutex.
  // A lane: its connection, and whether it is among that one's lanes
  // (loop only).
  bool is_lane = false;
  bool attached = false;
  // The caller's side: lanes asked for (any thread), and opened (loop
  // only; at the ack, or when asked after it).
  std::atomic<bool> lanes_wanted{false};
  bool lanes_opened = false;
  // Every lane it opened, connected or not (loop only): closed with it.
  std::vector<std::shared_ptr<Connection>> opened_lanes;
  std::weak_ptr<Connection> parent;
  // Buffers coming in parts (loop only), by transfer id, and frames that
  // wait for theirs.
  std::unordered_map<uint64_t, Transfer> transfers;
  uint64_t transfer_bytes = 0;
  std::deque<Frame> parked;
};

SegmentUse::~SegmentUse() {
  // Through the loop: this may run anywhere, even under the connection's
  // lock.
  if (auto t = transport.lock()) {
    asio::post(t->io, [conn = conn, segment = segment, own = own] {
      if (auto c = conn.lock()) {
        c->segment_done(segment, own);
      }
    });
  }
}

std::string Transport::Impl::peer_label(int id) const {
  if (id < 0) {
    return "a peer before its handshake";
  }
  auto it = peers.find(id);
  if (it == peers.end()) {
    return "worker " + std::to_string(id);
  }
  return "worker '" + it->second.name + "' (id " + std::to_string(id) + ", " +
         it->second.host + ":" + std::to_string(it->second.port) + ")";
}

void Transport::Impl::adopt(Socket socket, bool local) {
  auto conn =
      std::make_shared<Connection>(*this, std::move(socket), false, local);
  incoming.insert(conn);
  conn->start();
}

void Transport::Impl::start_accept() {
  acceptor.async_accept([this](const asio::error_code& ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) {
      return;
    }
    asio::error_code ep_ec;
    auto endpoint = s.local_endpoint(ep_ec);
    if (!ec && !ep_ec) {
      auto protocol = endpoint.protocol();
      adopt(
          Socket(
              io,
              asio::generic::stream_protocol(
                  protocol.family(), protocol.protocol()),
              s.release()),
          false);
    } else {
      TIDE_LOG_WARN("[{}] accept failed: {}", options.self_name, ec.message());
    }
    start_accept();
  });
}

void Transport::Impl::start_local_accept() {
  local_acceptor.async_accept([this](
                                  const asio::error_code& ec,
                                  asio::local::stream_protocol::socket s) {
    if (ec == asio::error::operation_aborted || !local_acceptor.is_open()) {
      return;
    }
    if (!ec) {
      adopt(
          Socket(io, asio::generic::stream_protocol(AF_UNIX, 0), s.release()),
          true);
    } else {
      TIDE_LOG_WARN("[{}] accept failed: {}", options.self_name, ec.message());
    }
    start_local_accept();
  });
}

std::shared_ptr<Connection> Transport::Impl::connect_on_loop(int to) {
  std::unique_lock lock(calls_mutex);
  if (stopped) {
    throw NetworkError("rpc agent '" + options.self_name + "' is shut down");
  }
  if (auto it = outgoing.find(to); it != outgoing.end()) {
    return it->second;
  }
  auto peer = peers.find(to);
  if (peer == peers.end()) {
    throw InvalidArgument("no worker with id " + std::to_string(to));
  }
  bool local = options.shared_memory && !peer->second.local_name.empty() &&
               peer->second.host_key == host_key;
  auto conn = std::make_shared<Connection>(*this, Socket(io), true, local);
  conn->peer_id = to;
  Message hello{MessageType::kHandshake, 0, {}, {}};
  hello.metadata = handshake_metadata(local);
  // Queued first, written once connected; the requests of callers that find
  // the connection in `outgoing` (from now on) queue behind it.
  conn->send(std::move(hello));
  outgoing[to] = conn;
  lock.unlock();
  if (!local) {
    connect_tcp(conn);
    return conn;
  }
  std::string name = std::string(1, '\0') + peer->second.local_name;
  Endpoint ep{asio::local::stream_protocol::endpoint(name)};
  conn->socket.async_connect(ep, [this, conn](const asio::error_code& e) {
    if (conn->closed) {
      return;
    }
    if (!e) {
      conn->start();
      return;
    }
    // The name is per network namespace and host: a peer that shares our
    // key but not our namespace view (or that is gone) is reached by TCP.
    TIDE_LOG_DEBUG(
        "[{}] no local socket to {} ({}); using TCP",
        options.self_name,
        peer_label(conn->peer_id),
        e.message());
    asio::error_code ignored;
    conn->socket.close(ignored);
    conn->local = false;
    // The handshake (first in the queue, unsent) must not offer shared
    // memory over TCP.
    Message hello{MessageType::kHandshake, 0, {}, {}};
    hello.metadata = handshake_metadata(false);
    {
      std::lock_guard lock(conn->wmutex);
      conn->queue.front() = conn->encode_frame(std::move(hello));
    }
    connect_tcp(conn);
  });
  return conn;
}

void Transport::Impl::connect_tcp(
    const std::shared_ptr<Connection>& conn, std::function<void()> connected) {
  const PeerAddress& peer = peers.at(conn->peer_id);
  asio::error_code ec;
  auto address = asio::ip::make_address(peer.host, ec);
  std::vector<Endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(tcp::endpoint(address, peer.port));
  } else {
    tcp::resolver resolver(io);
    for (const auto& r :
         resolver.resolve(peer.host, std::to_string(peer.port), ec)) {
      endpoints.emplace_back(r.endpoint());
    }
    if (endpoints.empty()) {
      // Failed on the next turn of the loop, like any connect error.
      asio::post(io, [conn, what = ec.message(), host = peer.host] {
        conn->fail("cannot resolve '" + host + "': " + what);
      });
      return;
    }
  }
  asio::async_connect(
      conn->socket,
      endpoints,
      [conn, connected = std::move(connected)](
          const asio::error_code& e, const Endpoint&) {
        if (conn->closed) {
          return;
        }
        if (e) {
          conn->fail("connect failed: " + e.message());
          return;
        }
        conn->start();
        if (connected) {
          connected();
        }
      });
}

void Transport::Impl::open_lanes(const std::shared_ptr<Connection>& parent) {
  // Once, for a TCP connection that is up (asked for from another thread,
  // want_lanes() may meet the ack here).
  if (parent->lanes_opened || parent->closed || parent->local) {
    return;
  }
  parent->lanes_opened = true;
  for (uint32_t j = 0; j < options.lanes; ++j) {
    auto lane = std::make_shared<Connection>(*this, Socket(io), true, false);
    parent->opened_lanes.push_back(lane);
    lane->peer_id = parent->peer_id;
    lane->is_lane = true;
    lane->parent = parent;
    lane->handshaken = true;
    // Parts come from the first frame on: no handshake limits.
    lane->decoder = FrameDecoder(FrameLimits{});
    lane->read_parts_in_place();
    Message hello{MessageType::kLaneHello, 0, {}, {}};
    hello.metadata =
        FieldWriter().i32(options.self_id).u32(j).str(options.token).take();
    lane->send(std::move(hello));
    // Used once connected: a lane that cannot connect is left out.
    connect_tcp(lane, [parent, lane] {
      if (parent->closed) {
        lane->fail("its connection closed");
        return;
      }
      lane->attached = true;
      std::lock_guard lock(parent->wmutex);
      parent->lanes.push_back(lane);
    });
  }
}

void Transport::Impl::start_call_on_loop(
    uint64_t id,
    std::chrono::milliseconds timeout,
    Pending call,
    Payload args) {
  std::shared_ptr<Connection> conn;
  try {
    conn = connect_on_loop(call.peer);
  } catch (...) {
    complete(call, std::nullopt, std::current_exception());
    return;
  }
  send_call(conn, id, timeout, std::move(call), std::move(args));
}

void Transport::Impl::send_call(
    const std::shared_ptr<Connection>& conn,
    uint64_t id,
    std::chrono::milliseconds timeout,
    Pending call,
    Payload args) {
  std::string meta = FieldWriter()
                         .str(call.fn)
                         .i64(static_cast<int64_t>(timeout.count()))
                         .take();
  {
    std::unique_lock lock(calls_mutex);
    auto it = outgoing.find(call.peer);
    if (stopped || it == outgoing.end() || it->second != conn) {
      // Failed between the lookup and now: its calls were failed already.
      lock.unlock();
      std::string what = call.fn + "() on worker " + std::to_string(call.peer) +
                         " failed: the connection closed";
      complete(call, std::nullopt, std::make_exception_ptr(NetworkError(what)));
      return;
    }
    // A timeout past any useful horizon (milliseconds::max()) never fires.
    auto now = Clock::now();
    auto at = timeout < std::chrono::hours(24 * 365 * 100)
                  ? now + timeout
                  : Clock::time_point::max();
    call.timeout = timeout;
    call.deadline = deadlines.emplace(at, id);
    pending.emplace(id, std::move(call));
    // Calls mostly share a timeout: a later deadline needs no new timer.
    if (at < timer_at) {
      timer_at = at;
      asio::post(io, [this] { expire_calls(); });
    }
  }
  try {
    conn->send(payload_message(
        MessageType::kRequest, id, std::move(meta), std::move(args)));
  } catch (...) {
    if (auto p = take_call(id)) {
      complete(*p, std::nullopt, std::current_exception());
    }
  }
}

void Transport::Impl::expire_calls() {
  std::vector<uint64_t> late;
  Clock::time_point next;
  {
    std::lock_guard lock(calls_mutex);
    auto now = Clock::now();
    for (auto it = deadlines.begin(); it != deadlines.end() && it->first <= now;
         ++it) {
      late.push_back(it->second);
    }
    next = deadlines.size() > late.size()
               ? std::next(deadlines.begin(), static_cast<long>(late.size()))
                     ->first
               : Clock::time_point::max();
    timer_at = next;
  }
  for (uint64_t id : late) {
    if (auto p = take_call(id)) {
      std::string what = p->fn + "() on " + peer_label(p->peer) +
                         " timed out after " +
                         std::to_string(p->timeout.count()) + " ms";
      complete(*p, std::nullopt, std::make_exception_ptr(TimeoutError(what)));
    }
  }
  if (next == Clock::time_point::max()) {
    deadline_timer.cancel();
    return;
  }
  deadline_timer.expires_at(next);
  deadline_timer.async_wait([this](const asio::error_code& ec) {
    if (!ec) {
      expire_calls();
    }
  });
}

std::optional<Transport::Impl::Pending> Transport::Impl::take_call(
    uint64_t id) {
  std::lock_guard lock(calls_mutex);
  auto it = pending.find(id);
  if (it == pending.end()) {
    return std::nullopt;
  }
  Pending p = std::move(it->second);
  pending.erase(it);
  deadlines.erase(p.deadline);
  return p;
}

void Transport::Impl::complete(
    Pending& call, std::optional<Payload> value, std::exception_ptr error) {
  pending_count.fetch_sub(1);
  // Continuations run here, on whatever thread completes the call: one that
  // throws must not take the I/O thread (or a reader) down with it.
  try {
    if (error) {
      call.promise.set_exception(std::move(error));
    } else {
      call.promise.set_value(std::move(*value));
    }
  } catch (const std::exception& e) {
    TIDE_LOG_ERROR(
        "[{}] a continuation of {}() threw: {}",
        options.self_name,
        call.fn,
        e.what());
  } catch (...) {
    TIDE_LOG_ERROR(
        "[{}] a continuation of {}() threw", options.self_name, call.fn);
  }
}

void Transport::Impl::connection_failed(
    Connection& conn, const std::string& reason) {
  auto self = conn.shared_from_this();  // Keep it alive through the erase.
  if (conn.is_lane) {
    incoming.erase(self);
    auto p = conn.parent.lock();
    TIDE_LOG_DEBUG(
        "[{}] lane to {} closed: {}",
        options.self_name,
        peer_label(conn.peer_id),
        reason);
    // Its parts are lost: so are the calls of its connection.
    if (p && conn.attached && !p->closed) {
      p->fail("one of its lanes failed: " + reason);
    }
    return;
  }
  if (!conn.outgoing) {
    incoming.erase(self);
    TIDE_LOG_DEBUG(
        "[{}] connection from {} closed: {}",
        options.self_name,
        peer_label(conn.peer_id),
        reason);
    return;
  }
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(calls_mutex);
    if (auto it = outgoing.find(conn.peer_id);
        it != outgoing.end() && it->second == self) {
      outgoing.erase(it);
    }
    // Every call pending to this peer is on this connection: a call takes
    // the one in `outgoing`, and it leaves `outgoing` only here, under the
    // same lock.
    for (const auto& [id, call] : pending) {
      if (call.peer == conn.peer_id) {
        ids.push_back(id);
      }
    }
  }
  for (uint64_t id : ids) {
    if (auto p = take_call(id)) {
      std::string what =
          p->fn + "() on " + peer_label(conn.peer_id) + " failed: " + reason;
      complete(*p, std::nullopt, std::make_exception_ptr(NetworkError(what)));
    }
  }
}

size_t Transport::Impl::poll_holding_loop(bool one) {
  bool was_in_loop = std::exchange(t_in_loop, true);
  size_t n = 1;
  try {
    n = one ? io.poll_one() : io.poll();
  } catch (const std::exception& e) {
    TIDE_LOG_ERROR("rpc I/O loop: a handler threw: {}", e.what());
  } catch (...) {
    TIDE_LOG_ERROR("rpc I/O loop: a handler threw a non-standard exception");
  }
  t_in_loop = was_in_loop;
  if (n > 0) {
    last_work_ns.store(now_ns(), std::memory_order_relaxed);
  }
  return n;
}

// The I/O thread polls while work is recent (yielding the core to anything
// runnable between polls), then sleeps in epoll. While another thread helps,
// it stands aside: two pollers would only take turns.
void Transport::Impl::run_loop() {
  t_in_loop = true;
  auto recent = [this] {
    return now_ns() - last_work_ns.load(std::memory_order_relaxed) <
           std::chrono::nanoseconds(kSpin).count();
  };
  while (!io.stopped()) {
    if (helpers.load(std::memory_order_relaxed) > 0 && recent()) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock loop(loop_mutex);
    if (poll_holding_loop(false) > 0) {
      continue;
    }
    if (io.stopped()) {
      return;
    }
    if (recent()) {
      loop.unlock();
      std::this_thread::yield();
      continue;
    }
    loop_sleeping.store(true);
    size_t ran = 0;
    try {
      ran = io.run_one();
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("rpc I/O loop: a handler threw: {}", e.what());
      ran = 1;
    } catch (...) {
      TIDE_LOG_ERROR("rpc I/O loop: a handler threw a non-standard exception");
      ran = 1;
    }
    loop_sleeping.store(false);
    if (ran == 0) {
      return;  // Out of work: shut down.
    }
    last_work_ns.store(now_ns(), std::memory_order_relaxed);
  }
}

// A waiting thread runs the loop's handlers itself while no one else does:
// the reply it waits for is then read and completed here, with no hand-off
// to the I/O thread and back. It stops when done() holds, after kSpin
// without work, or when the I/O thread sleeps in epoll (holding the loop;
// it will take what comes).
void Transport::Impl::help(const std::function<bool()>& done) {
  if (t_in_loop) {
    return;
  }
  helpers.fetch_add(1);
  auto last = std::chrono::steady_clock::now();
  while (!done() && !io.stopped() &&
         std::chrono::steady_clock::now() - last < kSpin) {
    std::unique_lock loop(loop_mutex, std::try_to_lock);
    if (!loop.owns_lock()) {
      if (loop_sleeping.load()) {
        break;
      }
      std::this_thread::yield();
      continue;
    }
    // One handler at a time: done() may hold after any, and the I/O thread
    // takes the rest when this one leaves (a runner has a function to run).
    size_t ran = poll_holding_loop(true);
    loop.unlock();
    if (ran > 0) {
      last = std::chrono::steady_clock::now();
    } else {
      std::this_thread::yield();
    }
  }
  helpers.fetch_sub(1);
}

void Transport::Impl::stop_on_loop() {
  std::unordered_map<int, std::shared_ptr<Connection>> out;
  {
    std::lock_guard lock(calls_mutex);
    if (stopped) {
      return;
    }
    stopped = true;
    out = outgoing;
  }
  asio::error_code ignored;
  acceptor.close(ignored);
  local_acceptor.close(ignored);
  for (auto& [id, conn] : out) {
    conn->fail("the rpc agent shut down");
  }
  auto in = incoming;
  for (const auto& conn : in) {
    conn->fail("the rpc agent shut down");
  }
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(calls_mutex);
    for (const auto& [id, p] : pending) {
      ids.push_back(id);
    }
  }
  for (uint64_t id : ids) {
    if (auto p = take_call(id)) {
      complete(
          *p,
          std::nullopt,
          std::make_exception_ptr(NetworkError(
              "rpc agent '" + options.self_name + "' is shut down")));
    }
  }
  deadline_timer.cancel();
  work.reset();
}

Transport::Transport(TransportOptions options, RequestHandler on_request)
    : impl_(std::make_shared<Impl>(std::move(options), std::move(on_request))) {
  Impl& impl = *impl_;
  const std::string& listen_host = impl.options.listen_host;
  asio::error_code ec;
  auto address = asio::ip::make_address(listen_host, ec);
  if (ec) {
    throw InvalidArgument(
        "rpc listen address '" + listen_host + "' is not an IP address");
  }
  tcp::endpoint ep(address, 0);
  impl.acceptor.open(ep.protocol(), ec);
  if (!ec) {
    impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    impl.acceptor.bind(ep, ec);
  }
  if (!ec) {
    impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    throw NetworkError(
        "rpc agent cannot listen on " + listen_host + ": " + ec.message());
  }
  impl.port = impl.acceptor.local_endpoint().port();
  impl.start_accept();
  if (impl.options.shared_memory) {
    std::string name =
        "tide-rpc-" + std::to_string(::getpid()) + "-" + random_id(16);
    asio::local::stream_protocol::endpoint local(std::string(1, '\0') + name);
    impl.local_acceptor.open(local.protocol(), ec);
    if (!ec) {
      impl.local_acceptor.bind(local, ec);
    }
    if (!ec) {
      impl.local_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    }
    if (ec) {
      // TCP still works: peers of this host connect over it.
      TIDE_LOG_WARN(
          "[{}] no local socket for shared memory ({}); using TCP only",
          impl.options.self_name,
          ec.message());
      impl.local_acceptor.close(ec);
    } else {
      impl.local_name = name;
      impl.start_local_accept();
    }
  }
  impl.thread = std::jthread([&impl] { impl.run_loop(); });
}

Transport::~Transport() {
  shutdown();
  join();
}

uint16_t Transport::port() const {
  return impl_->port;
}

const std::string& Transport::local_name() const {
  return impl_->local_name;
}

void Transport::set_peers(std::vector<PeerAddress> peers) {
  auto done = std::make_shared<Promise<void>>();
  asio::post(impl_->io, [impl = impl_.get(), peers = std::move(peers), done] {
    for (auto& p : peers) {
      impl->peers[p.id] = p;
    }
    done->set_value();
  });
  done->get_future().wait(std::chrono::seconds(60));
}

Future<Payload> Transport::call(
    int to, std::string fn, std::chrono::milliseconds timeout, Payload args) {
  Promise<Payload> promise;
  Future<Payload> future = promise.get_future();
  if (impl_->stopping.load()) {
    promise.set_error(NetworkError(
        "rpc agent '" + impl_->options.self_name + "' is shut down"));
    return future;
  }
  uint64_t id = impl_->next_id.fetch_add(1);
  impl_->pending_count.fetch_add(1);
  Impl::Pending call{std::move(promise), to, std::move(fn), timeout, {}};
  std::shared_ptr<Connection> conn;
  {
    std::unique_lock lock(impl_->calls_mutex);
    if (impl_->stopped) {
      lock.unlock();
      impl_->complete(
          call,
          std::nullopt,
          std::make_exception_ptr(NetworkError(
              "rpc agent '" + impl_->options.self_name + "' is shut down")));
      return future;
    }
    if (auto it = impl_->outgoing.find(to); it != impl_->outgoing.end()) {
      conn = it->second;
    } else {
      // Posted under the lock, before stop_on_loop() can mark the transport
      // stopped: the loop runs it (and fails it if stopping by then).
      asio::post(
          impl_->io,
          [impl = impl_.get(),
           id,
           timeout,
           call = std::move(call),
           args = std::move(args)]() mutable {
            impl->start_call_on_loop(
                id, timeout, std::move(call), std::move(args));
          });
      return future;
    }
  }
  // Open already: sent from this thread, without waking the loop.
  impl_->send_call(conn, id, timeout, std::move(call), std::move(args));
  return future;
}

size_t Transport::pending_calls() const {
  return impl_->pending_count.load();
}

std::string Transport::connection_kind(int to) {
  auto done = std::make_shared<Promise<std::string>>();
  asio::post(impl_->io, [impl = impl_.get(), to, done] {
    std::lock_guard lock(impl->calls_mutex);
    auto it = impl->outgoing.find(to);
    done->set_value(
        it == impl->outgoing.end() ? ""
        : it->second->local        ? "shm"
                                   : "tcp");
  });
  return done->get_future().wait(std::chrono::seconds(60));
}

Transport::Stats Transport::stats() const {
  return Stats{
      impl_->buffers_via_shm.load(),
      impl_->bytes_via_shm.load(),
      impl_->segments.load(),
      impl_->buffers_returned.load(),
      impl_->buffers_via_lanes.load(),
      impl_->bytes_via_lanes.load()};
}

void Transport::help(const std::function<bool()>& done) {
  auto keep = impl_;
  keep->help(done);
}

void Transport::shutdown() {
  if (impl_->stopping.exchange(true)) {
    return;
  }
  asio::post(impl_->io, [impl = impl_.get()] { impl->stop_on_loop(); });
}

void Transport::join() {
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  }
}

}  // namespace tide::rpc::detail
