// The RPC transport: the choice of shared memory or TCP per pair, tokens,
// malformed shared-memory frames, graceful shutdown across processes, and
// two network-namespace hosts.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"
#include "tide/rpc/rpc.h"
#include "tide/store/tcp_store.h"

#include "rpc/messages.h"
#include "support/netns.h"
#include "support/peak_memory.h"
#include "support/raw_client.h"
#include "support/raw_rpc.h"
#include "support/rpc_child.h"
#include "support/rpc_entry.h"
#include "support/subprocess.h"
#include "transport/auth.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/frame.h"
#include "transport/transport.h"

namespace tide::rpc {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Bytes that travel out of band, as a tensor's do.
struct Blob {
  Buffer bytes;

  void serialize(Encoder& e) const {
    encode(e, static_cast<uint64_t>(e.add_buffer(bytes)));
  }
  static Blob deserialize(Decoder& d) {
    return {d.buffer(decode<uint64_t>(d))};
  }
};

Blob make_blob(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    s[i] = static_cast<char>(seed + 13 * i);
  }
  return {Buffer(std::move(s))};
}

TIDE_RPC_FUNCTION(echo_blob, [](Blob b) { return b; });

std::shared_ptr<store::Store> store_client(uint16_t port) {
  return std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = "127.0.0.1", .port = port, .timeout = 30s});
}

class AgentTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<store::TcpStore>(store::TcpStoreOptions{
        .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 30s});
  }

  // One agent per entry of `options`, started together.
  std::vector<std::unique_ptr<RpcAgent>> group(
      const std::vector<RpcBackendOptions>& options) {
    std::vector<std::future<std::unique_ptr<RpcAgent>>> starting;
    int n = static_cast<int>(options.size());
    for (int r = 0; r < n; ++r) {
      starting.push_back(std::async(std::launch::async, [&, r] {
        return std::make_unique<RpcAgent>(
            std::string(1, static_cast<char>('a' + r)),
            r,
            n,
            options[r],
            store_client(server_->port()));
      }));
    }
    std::vector<std::unique_ptr<RpcAgent>> agents;
    for (auto& s : starting) {
      agents.push_back(s.get());
    }
    return agents;
  }

  // What worker `rank` published in the store.
  transport::PeerAddress published(int rank) {
    return test::published_entry(*store_client(server_->port()), rank);
  }

  std::unique_ptr<store::TcpStore> server_;
};

TEST_F(AgentTransportTest, OneHostUsesSharedMemoryForLargeBuffers) {
  auto agents = group({{}, {}});
  EXPECT_EQ(agents[0]->transport_to("b"), "");
  Blob small = make_blob(1000, 1);
  EXPECT_EQ(
      agents[0]->rpc_sync<Blob>("b", "echo_blob", small).bytes, small.bytes);
  EXPECT_EQ(agents[0]->transport_to("b"), "shm");
  EXPECT_EQ(agents[0]->transport_stats().buffers_via_shm, 0u);
  Blob large = make_blob(3 << 20, 2);
  EXPECT_EQ(
      agents[0]->rpc_sync<Blob>("b", "echo_blob", large).bytes, large.bytes);
  auto stats = agents[0]->transport_stats();
  EXPECT_EQ(stats.buffers_via_shm, 1u);
  EXPECT_EQ(stats.bytes_via_shm, uint64_t{3} << 20);
  EXPECT_EQ(stats.segments, 1u);
  // b sent the bytes back in a's own segment: no copy, no segment of b's.
  EXPECT_EQ(agents[1]->transport_stats().buffers_via_shm, 0u);
  EXPECT_EQ(agents[1]->transport_stats().buffers_returned, 1u);
  EXPECT_EQ(agents[1]->transport_stats().segments, 0u);
}

TEST_F(AgentTransportTest, TcpOnlyWhenAsked) {
  RpcBackendOptions tcp;
  tcp.transports = {"tcp"};
  auto agents = group({tcp, {}});
  Blob large = make_blob(3 << 20, 3);
  EXPECT_EQ(
      agents[0]->rpc_sync<Blob>("b", "echo_blob", large).bytes, large.bytes);
  EXPECT_EQ(agents[0]->transport_to("b"), "tcp");
  EXPECT_EQ(agents[0]->transport_stats().buffers_via_shm, 0u);
  // b takes shared memory, but a does not offer it: b's calls to a go by
  // TCP too (a has no local socket).
  EXPECT_EQ(
      agents[1]->rpc_sync<Blob>("a", "echo_blob", large).bytes, large.bytes);
  EXPECT_EQ(agents[1]->transport_to("a"), "tcp");
}

TEST_F(AgentTransportTest, BadTransportListsAreRefused) {
  auto store = store_client(server_->port());
  RpcBackendOptions shm_only;
  shm_only.transports = {"shm"};
  try {
    RpcAgent agent("a", 0, 1, shm_only, store);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("must include tcp"));
  }
  RpcBackendOptions unknown;
  unknown.transports = {"ib", "tcp"};
  try {
    RpcAgent agent("a", 0, 1, unknown, store);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown rpc transport 'ib'"));
  }
}

TEST_F(AgentTransportTest, ATokenRefusesWorkersWithoutIt) {
  // a and b take the token from the environment; c has another.
  ::setenv("TIDE_RPC_TOKEN", "s3cret", 1);
  RpcBackendOptions wrong;
  wrong.token = "guess";
  auto agents = group({{}, {}, wrong});
  ::unsetenv("TIDE_RPC_TOKEN");
  agents[1]->register_function(
      "add", [](int64_t x, int64_t y) { return x + y; });
  // c has the wrong one: b cannot prove itself to c, which sends it
  // nothing.
  try {
    agents[2]->rpc_sync<int64_t>("b", "add", 1, 2);
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_THAT(
        e.what(), HasSubstr("could not prove that it holds the group's token"));
    EXPECT_THAT(e.what(), HasSubstr("nothing was sent"));
  }
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("b", "add", 1, 2), 3);
  for (auto& a : agents) {
    a->shutdown(false);
  }
}

// A raw client on b's Unix socket, through its handshake.
class RawLocalPeer {
 public:
  // Throws std::runtime_error when b refuses the handshake (sent with `fd`
  // when not -1).
  explicit RawLocalPeer(const std::string& name, int fd = -1) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    auto len = static_cast<socklen_t>(
        offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (fd_ < 0 ||
        ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      throw std::runtime_error("RawLocalPeer: connect failed");
    }
    // As worker a, which lives in this process (b checks the pid).
    bool first = true;
    test::handshake_as_caller(
        fd_,
        [&](const std::string& bytes) {
          send(bytes, first ? fd : -1);
          first = false;
        },
        0,
        "a",
        "",
        transport::kFeatureSharedMemory);
  }
  ~RawLocalPeer() {
    ::close(fd_);
  }

  // Sends bytes, and `fd` with them when not -1.
  void send(const std::string& bytes, int fd = -1) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
    if (fd >= 0) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    ASSERT_EQ(
        ::sendmsg(fd_, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }

  // The next frame b sends (an answer, a release), within 10 s.
  transport::Frame read_frame() {
    static const transport::MessageTypes kTypes = [] {
      transport::MessageTypes t;
      t.add(transport::control_types()).add(detail::rpc_message_types());
      return t;
    }();
    transport::FrameDecoder d(kTypes);
    while (true) {
      if (auto f = d.next()) {
        return std::move(*f);
      }
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      char c = 0;
      if (::poll(&p, 1, 10'000) != 1 || ::recv(fd_, &c, 1, 0) != 1) {
        throw std::runtime_error("RawLocalPeer: no frame");
      }
      d.feed(&c, 1);
    }
  }

  // True when the peer closes the connection within `timeout`.
  bool closed_within(std::chrono::milliseconds timeout) {
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    std::array<char, 4096> buf{};
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::poll(&p, 1, 100) > 0) {
        ssize_t k = ::recv(fd_, buf.data(), buf.size(), MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno == ECONNRESET)) {
          return true;
        }
      }
    }
    return false;
  }

 private:
  int fd_ = -1;
};

// A request whose one 1 MiB buffer is said to be in a segment: `table`
// bytes of references follow the (empty) buffer.
std::string shm_request(
    const std::string& table,
    const std::string& fn = "echo_blob",
    uint16_t flags = transport::kFlagSharedMemory) {
  std::string meta = transport::FieldWriter().str(fn).i64(10'000).take();
  std::string args;
  std::vector<Buffer> buffers;
  Encoder a(args, &buffers);
  encode_args(a, Blob{});  // refers to buffer 1
  transport::Frame f{
      .type = detail::MessageType::kRequest,
      .flags = flags,
      .id = 1,
      .metadata = meta,
      .buffers = {args, "", table}};
  return transport::encode(f);
}

// kind: 0 the sender's segment, passed before; 1 passed with this frame;
// 2 the receiver's own.
std::string shm_ref(
    uint32_t kind,
    uint64_t segment_size,
    uint64_t length = uint64_t{1} << 20,
    uint64_t segment = 7) {
  std::string out;
  auto put = [&](auto v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  put(uint32_t{1});  // buffer index
  put(kind);
  put(segment);
  put(segment_size);
  put(length);
  return out;
}

TEST_F(AgentTransportTest, MalformedSharedMemoryFramesDropOnlyThatConnection) {
  auto agents = group({{}, {}});
  std::string local_name = published(1).local_name;
  ASSERT_FALSE(local_name.empty());

  // A descriptor the frame says comes, but does not.
  {
    RawLocalPeer peer(local_name);
    peer.send(shm_request(shm_ref(1, 1 << 20)));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // A memfd that is not sealed: the sender could shrink it under us.
  {
    int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
    RawLocalPeer peer(local_name);
    peer.send(shm_request(shm_ref(1, 1 << 20)), fd);
    ::close(fd);
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // A descriptor with the handshake, before the peer is known.
  {
    int fd = ::memfd_create("early", MFD_CLOEXEC);
    EXPECT_THROW(RawLocalPeer(local_name, fd), std::runtime_error);
    ::close(fd);
  }
  // A segment never passed, one of a size that does not fit the length, one
  // of b's that b never sent, and a table that is not whole entries.
  for (const std::string& table :
       {shm_ref(0, 1 << 20),
        shm_ref(0, 2 << 20),
        shm_ref(2, 1 << 20),
        shm_ref(0, 1 << 20).substr(0, 31)}) {
    RawLocalPeer peer(local_name);
    peer.send(shm_request(table));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // Another path's table: lanes (a whole one: 2 parts of transfer 9, of
  // 2 MiB, for buffer 1) on a connection whose buffers travel through
  // shared memory, which has no lanes to wait for.
  {
    std::string lanes;
    auto put = [&](auto v) {
      lanes.append(reinterpret_cast<const char*>(&v), sizeof v);
    };
    put(uint32_t{1});
    put(uint32_t{2});
    put(uint64_t{9});
    put(uint64_t{2} << 20);
    RawLocalPeer peer(local_name);
    peer.send(shm_request(lanes, "echo_blob", transport::kFlagLanes));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  Blob large = make_blob(2 << 20, 4);
  EXPECT_EQ(
      agents[0]->rpc_sync<Blob>("b", "echo_blob", large).bytes, large.bytes);
}

TIDE_RPC_FUNCTION(blob_size, [](Blob b) {
  return static_cast<int64_t>(b.bytes.size());
});

TEST_F(AgentTransportTest, SegmentsAPeerNeverTouchedCostTheReceiverNothing) {
  auto agents = group({{}, {}});
  std::string local_name = published(1).local_name;
  RawLocalPeer peer(local_name);
  test::PeakMemory peak;
  // Three sealed 256 MiB segments, never written, each under a request
  // whose function reads only the buffer's size.
  constexpr uint64_t k256MiB = uint64_t{256} << 20;
  for (uint64_t segment = 1; segment <= 3; ++segment) {
    int fd = ::memfd_create("untouched", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(k256MiB)), 0);
    ASSERT_EQ(
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    peer.send(
        shm_request(shm_ref(1, k256MiB, k256MiB, segment), "blob_size"), fd);
    ::close(fd);
  }
  // b answers all three.
  for (int answered = 0; answered < 3;) {
    transport::Frame f = peer.read_frame();
    answered += f.type == detail::MessageType::kResponse ? 1 : 0;
  }
  // Mapped ahead of use, they were +786 MB.
  EXPECT_LT(peak.growth(), uint64_t{64} << 20);
}

TEST_F(AgentTransportTest, AHandshakeCarriesNoBuffers) {
  auto agents = group({{}, {}});
  uint16_t port = published(1).port;
  std::string meta = transport::FieldWriter()
                         .i32(0)
                         .str("a")
                         .u32(0)
                         .str(transport::auth::nonce())
                         .u32(0)
                         .take();
  test::RawClient raw(port);
  // A stranger's first frame may not bring a gigabyte: the buffer's length
  // alone ends the connection.
  std::string hello = transport::encode(
      {.type = transport::ControlType::kHandshake,
       .metadata = meta,
       .buffers = {"x"}});
  ASSERT_TRUE(raw.send(hello));
  EXPECT_TRUE(raw.closed_within(10s));
  EXPECT_EQ(
      agents[0]->rpc_sync<Blob>("b", "echo_blob", make_blob(10, 1)).bytes,
      make_blob(10, 1).bytes);
}

// Raw TCP peers of b for the lane tests: a connection through its
// handshake (as worker `id`), and lanes beside it.

struct RawTcpPeer {
  std::unique_ptr<test::RawClient> raw;
  transport::auth::Session session;

  bool send(const std::string& bytes) {
    return raw->send(bytes);
  }
  bool closed_within(std::chrono::milliseconds timeout) {
    return raw->closed_within(timeout);
  }
};

// As worker a (id 0), which the group knows.
std::unique_ptr<RawTcpPeer> raw_tcp_peer(
    uint16_t port, const std::string& token) {
  auto peer = std::make_unique<RawTcpPeer>();
  peer->raw = std::make_unique<test::RawClient>(port);
  peer->session = test::handshake_as_caller(
      peer->raw->fd(),
      [&](const std::string& b) { EXPECT_TRUE(peer->raw->send(b)); },
      0,
      "a",
      token);
  return peer;
}

// A lane's hello, proved with the session of its connection.
std::string lane_hello(
    int id,
    uint32_t index,
    const std::string& token,
    const transport::auth::Session& session) {
  return transport::encode(
      {.type = transport::ControlType::kLaneHello,
       .metadata = transport::FieldWriter()
                       .i32(id)
                       .u32(index)
                       .str(transport::auth::proof(
                           token, transport::auth::Role::kLane, session, index))
                       .take()});
}

std::string buffer_part(
    uint64_t transfer,
    uint32_t index,
    uint32_t parts,
    uint64_t total,
    size_t bytes) {
  return transport::encode(
      {.type = transport::ControlType::kBufferPart,
       .id = transfer,
       .metadata =
           transport::FieldWriter().u32(index).u32(parts).u64(total).take(),
       .buffers = {std::string(bytes, 'p')}});
}

TEST_F(AgentTransportTest, AStrangersNameCannotForgeALogLine) {
  // What the logger writes during the test (the sink added and removed while
  // no agent runs).
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  tide::logger().sinks().push_back(sink);
  {
    RpcBackendOptions o;
    o.transports = {"tcp"};
    o.token = "s3cret";
    auto agents = group({o, o});
    test::RawClient raw(published(1).port);
    ASSERT_TRUE(raw.send(transport::encode(
        {.type = transport::ControlType::kHandshake,
         .metadata = transport::FieldWriter()
                         .i32(7)
                         .str("x\n[tide] [error] forged\x1b[31m")
                         .u32(0)
                         .str(transport::auth::nonce())
                         .u32(0)
                         .take()})));
    EXPECT_TRUE(raw.closed_within(10s));  // refused: logged before
    for (auto& a : agents) {
      a->shutdown(false);
    }
  }
  std::erase(tide::logger().sinks(), sink);
  std::string log = captured.str();
  EXPECT_THAT(
      log,
      HasSubstr("refused a connection from 'x\\x0a[tide] [error] "
                "forged\\x1b[31m' (id 7)"));
  EXPECT_EQ(log.find('\x1b'), std::string::npos);
  EXPECT_EQ(log.find("\n[tide] [error] forged"), std::string::npos);
}

TEST(PrintableTest, ControlBytesAndBackslashesAreEscapedAndLengthBounded) {
  EXPECT_EQ(tide::printable("w0"), "w0");
  EXPECT_EQ(tide::printable("a\nb\\c\x7f"), "a\\x0ab\\x5cc\\x7f");
  EXPECT_EQ(tide::printable(std::string(200, 'n'), 4), "nnnn...");
}

TEST_F(AgentTransportTest, MalformedLanesDropTheirConnection) {
  RpcBackendOptions o;
  o.transports = {"tcp"};
  o.token = "s3cret";
  auto agents = group({o, o});
  uint16_t port = published(1).port;
  constexpr uint64_t kMiB = 1 << 20;
  // A lane for a worker with no connection here, one without the token,
  // one whose proof is of another session, and a second lane 0: each is
  // closed, and the connection it named goes on.
  {
    test::RawClient lane(port);
    ASSERT_TRUE(lane.send(lane_hello(7, 0, "s3cret", {})));
    EXPECT_TRUE(lane.closed_within(10s));
  }
  {
    auto parent = raw_tcp_peer(port, "s3cret");
    auto other = parent->session;
    other.callee_nonce = transport::auth::nonce();
    for (const std::string& hello :
         {lane_hello(0, 0, "guess", parent->session),
          lane_hello(0, 0, "s3cret", other)}) {
      test::RawClient lane(port);
      ASSERT_TRUE(lane.send(hello));
      EXPECT_TRUE(lane.closed_within(10s));
    }
    test::RawClient lane(port);
    ASSERT_TRUE(lane.send(lane_hello(0, 0, "s3cret", parent->session)));
    test::RawClient again(port);
    ASSERT_TRUE(again.send(lane_hello(0, 0, "s3cret", parent->session)));
    EXPECT_TRUE(again.closed_within(10s));
    EXPECT_FALSE(parent->closed_within(200ms));
  }
  // Parts that cannot be: past the part count, a share of the wrong size,
  // a transfer under the lane threshold, a second copy of one part. The
  // lane goes, and with it the connection whose parts it carried.
  for (const std::string& parts :
       {buffer_part(1, 2, 2, 2 * kMiB, kMiB),
        buffer_part(1, 0, 2, 2 * kMiB, kMiB - 1),
        buffer_part(1, 0, 2, 1024, 512),
        buffer_part(1, 0, 2, 2 * kMiB, kMiB) +
            buffer_part(1, 0, 2, 2 * kMiB, kMiB)}) {
    auto parent = raw_tcp_peer(port, "s3cret");
    test::RawClient lane(port);
    ASSERT_TRUE(lane.send(lane_hello(0, 0, "s3cret", parent->session)));
    lane.send(parts);
    EXPECT_TRUE(lane.closed_within(10s));
    EXPECT_TRUE(parent->closed_within(10s));
  }
  // A lane joins the connection whose session it proves (an older one may
  // be a dead process's): a bad part there closes that one, not the other.
  {
    auto older = raw_tcp_peer(port, "s3cret");
    auto newer = raw_tcp_peer(port, "s3cret");
    test::RawClient lane(port);
    ASSERT_TRUE(lane.send(lane_hello(0, 0, "s3cret", older->session)));
    lane.send(buffer_part(1, 2, 2, 2 * kMiB, kMiB));
    EXPECT_TRUE(older->closed_within(10s));
    EXPECT_FALSE(newer->closed_within(200ms));
  }
  // A request whose lane table is torn, or names a buffer that is not
  // empty.
  auto request = [](const std::string& table, const std::string& buffer) {
    std::string args;
    std::vector<Buffer> buffers;
    Encoder a(args, &buffers);
    encode_args(a, Blob{});  // refers to buffer 1
    return transport::encode(
        {.type = detail::MessageType::kRequest,
         .flags = transport::kFlagLanes,
         .id = 1,
         .metadata = transport::FieldWriter().str("echo_blob").i64(1000).take(),
         .buffers = {args, buffer, table}});
  };
  auto ref = [](uint32_t index) {  // 2 parts of transfer 9, of 2 MiB
    std::string out;
    auto put = [&](auto v) {
      out.append(reinterpret_cast<const char*>(&v), sizeof v);
    };
    put(index);
    put(uint32_t{2});
    put(uint64_t{9});
    put(uint64_t{2} << 20);
    return out;
  };
  for (const std::string& frame :
       {request(ref(1).substr(0, 23), ""),
        request(ref(1), "x"),
        request(ref(0), ""),
        request(ref(2), ""),
        // Another path's table: shared memory on TCP.
        shm_request(shm_ref(0, 1 << 20))}) {
    auto parent = raw_tcp_peer(port, "s3cret");
    ASSERT_TRUE(parent->send(frame));
    EXPECT_TRUE(parent->closed_within(10s));
  }
  // b still serves, its large buffers over its lanes.
  Blob large = make_blob(3 << 20, 5);
  EXPECT_EQ(
      agents[0]->rpc_sync<Blob>("b", "echo_blob", large).bytes, large.bytes);
}

// The peer is this binary again (run_rpc_transport_child_if_requested),
// shutting down gracefully while calls to it are still running.
TEST_F(
    AgentTransportTest, GracefulShutdownWaitsForCallsInFlightAcrossProcesses) {
  test::Subprocess child(
      {"/proc/self/exe"},
      {.env = {{"TIDE_RPC_GRACEFUL_CHILD", std::to_string(server_->port())}}});
  RpcAgent parent("parent", 0, 2, {}, store_client(server_->port()));
  ASSERT_EQ(child.read_line(30s), "ready");
  std::vector<Future<int64_t>> calls;
  for (int64_t i = 0; i < 20; ++i) {
    calls.push_back(parent.rpc_async<int64_t>("child", "work", int64_t{50}, i));
  }
  // The child is in its own graceful shutdown already; ours waits for the
  // 20 calls, then both leave together.
  parent.shutdown(true);
  for (int64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(calls[i].ready()) << i;
    EXPECT_EQ(calls[i].wait(0ms), 2 * i);
  }
  EXPECT_EQ(child.read_line(30s), "shut down");
  EXPECT_EQ(child.wait(30s), 0);
}

// Two hosts in network namespaces: no shared Unix socket, so TCP. A group
// spread over hosts needs a secret (security.md): both ranks get one.
TEST(RpcNetnsTest, TwoHostsTalkOverTcp) {
  std::string why;
  if (!test::NetnsHosts::available(&why)) {
    GTEST_SKIP() << "network namespaces are not available here (" << why << ")";
  }
  test::NetnsHosts hosts(2);
  std::string self = std::filesystem::read_symlink("/proc/self/exe");
  std::string init = "tcp://" + hosts.addr(0) + ":29400";
  std::vector<std::unique_ptr<test::Subprocess>> ranks;
  for (int r : {1, 0}) {
    auto argv = hosts.exec_prefix(r);
    argv.push_back(self);
    ranks.push_back(std::make_unique<test::Subprocess>(
        argv,
        test::SubprocessOptions{
            .env = {
                {"TIDE_RPC_NETNS_CHILD",
                 std::to_string(r) + " " + init + " " + hosts.addr(r)},
                {"TIDE_RPC_TOKEN", "two-hosts-secret"}}}));
  }
  EXPECT_EQ(ranks[1]->read_line(60s), "transport=tcp blob=ok");
  for (auto& r : ranks) {
    EXPECT_EQ(r->wait(60s), 0);
  }
}

}  // namespace
}  // namespace tide::rpc

namespace tide::test {

void run_rpc_transport_child_if_requested() {
  using namespace std::chrono_literals;
  if (const char* port = std::getenv("TIDE_RPC_GRACEFUL_CHILD")) {
    rpc::RpcAgent agent(
        "child",
        1,
        2,
        {},
        rpc::store_client(static_cast<uint16_t>(std::atoi(port))));
    agent.register_function("work", [](int64_t ms, int64_t v) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // The work.
      return 2 * v;
    });
    std::printf("ready\n");
    std::fflush(stdout);
    agent.shutdown(true);
    std::printf("shut down\n");
    std::fflush(stdout);
    std::_Exit(0);
  }
  if (const char* spec = std::getenv("TIDE_RPC_NETNS_CHILD")) {
    int rank = 0;
    std::array<char, 256> init{};
    std::array<char, 64> host{};
    if (std::sscanf(spec, "%d %255s %63s", &rank, init.data(), host.data()) !=
        3) {
      std::_Exit(2);
    }
    rpc::RpcBackendOptions o;
    o.init_method = init.data();
    o.listen_host = host.data();
    rpc::RpcAgent agent(rank == 0 ? "driver" : "server", rank, 2, o);
    if (rank == 0) {
      rpc::Blob large = rpc::make_blob(3 << 20, 5);
      bool same =
          agent.rpc_sync<rpc::Blob>("server", "echo_blob", large).bytes ==
          large.bytes;
      std::printf(
          "transport=%s blob=%s\n",
          agent.transport_to("server").c_str(),
          same ? "ok" : "differs");
      std::fflush(stdout);
    }
    agent.shutdown(true);
    std::_Exit(0);
  }
}

}  // namespace tide::test
