// The transport on its own API: messages between two processes over each
// kind of connection (shared memory, TCP, TCP with lanes), whole and in
// order, and the loss of a SIGKILLed peer. No rpc layer: the peer is this
// binary re-executed (run_transport_peer_if_requested), echoing what comes.
#include "transport/transport.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/subprocess.h"
#include "support/transport_peer.h"

namespace tide::transport {
namespace {

using namespace std::chrono_literals;

constexpr MessageType kPing = kFirstUpperType;

const MessageTypes& ping_types() {
  static const MessageTypes kTypes{{kPing, "PING"}};
  return kTypes;
}

struct Mode {
  std::string name;  // "shm", "tcp", "lanes"
  bool shared_memory = false;
  size_t lanes = 0;
  // A buffer large enough to take the mode's own path (shared memory from
  // kShmThreshold, lanes from kLaneThreshold).
  size_t large = 0;
};

Mode mode_named(const std::string& name) {
  if (name == "shm") {
    return {name, true, 0, kShmThreshold * 2};
  }
  if (name == "lanes") {
    return {name, false, 2, kLaneThreshold * 2};
  }
  return {name, false, 0, kLaneThreshold * 2};
}

TransportOptions options_for(const Mode& mode, int id) {
  TransportOptions o;
  o.self_id = id;
  o.self_name = id == 0 ? "caller" : "echo";
  o.shared_memory = mode.shared_memory;
  o.lanes = mode.lanes;
  o.message_types = ping_types();
  return o;
}

// Bytes of buffer `which` of message `id`: each position tells where it is.
Buffer pattern(uint64_t id, size_t which, size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    s[i] = static_cast<char>((id * 31 + which * 7 + i) & 0xff);
  }
  return Buffer(std::move(s));
}

// The caller's side: what comes back, and the connections that closed.
struct Inbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Message> messages;    // Guarded by mutex.
  std::vector<std::string> closed;  // Guarded by mutex.

  TransportHandlers handlers() {
    return {
        .on_message =
            [this](const Pipe&, Message m) {
              std::lock_guard lock(mutex);
              messages.push_back(std::move(m));
              cv.notify_all();
            },
        .on_closed =
            [this](const Pipe& pipe, const std::string& why) {
              std::lock_guard lock(mutex);
              if (pipe.outgoing()) {
                closed.push_back(why);
              }
              cv.notify_all();
            }};
  }
  bool wait_for(const std::function<bool()>& done) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, 20s, done);
  }
};

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    mode_ = mode_named(GetParam());
    peer_.emplace(
        std::vector<std::string>{"/proc/self/exe"},
        test::SubprocessOptions{
            .env = {{"TIDE_TRANSPORT_TEST_PEER", mode_.name}}});
    auto ready = peer_->read_line(30s);
    ASSERT_TRUE(ready) << "the peer did not start";
    std::istringstream in(*ready);
    std::string word, local_name;
    int port = 0;
    in >> word >> port >> local_name;
    ASSERT_EQ(word, "ready");
    transport_ =
        std::make_unique<Transport>(options_for(mode_, 0), inbox_.handlers());
    transport_->set_peers(
        {{1,
          "echo",
          "127.0.0.1",
          static_cast<uint16_t>(port),
          local_host_key(),
          mode_.shared_memory ? local_name : ""}});
  }
  void TearDown() override {
    if (transport_) {
      transport_->shutdown();
      transport_->join();
    }
  }

  Message ping(uint64_t id) {
    return {
        kPing,
        id,
        "m" + std::to_string(id),
        {pattern(id, 0, 100), pattern(id, 1, 0), pattern(id, 2, mode_.large)}};
  }

  Mode mode_;
  std::optional<test::Subprocess> peer_;
  Inbox inbox_;
  std::unique_ptr<Transport> transport_;
};

TEST_P(TransportTest, EveryMessageComesBackWholeAndInOrder) {
  constexpr uint64_t kMessages = 20;
  Pipe pipe = transport_->pipe_to(1);
  for (uint64_t id = 1; id <= kMessages; ++id) {
    ASSERT_TRUE(pipe.send(ping(id)));
  }
  ASSERT_TRUE(inbox_.wait_for([&] {
    return inbox_.messages.size() == kMessages;
  })) << "echoes missing";
  std::unique_lock lock(inbox_.mutex);
  for (uint64_t id = 1; id <= kMessages; ++id) {
    const Message& m = inbox_.messages[id - 1];
    EXPECT_EQ(m.type, kPing);
    EXPECT_EQ(m.id, id);
    EXPECT_EQ(m.metadata, "m" + std::to_string(id));
    Message want = ping(id);
    ASSERT_EQ(m.buffers.size(), want.buffers.size());
    for (size_t b = 0; b < want.buffers.size(); ++b) {
      EXPECT_TRUE(m.buffers[b].view() == want.buffers[b].view())
          << "message " << id << ", buffer " << b;
    }
  }
  lock.unlock();
  EXPECT_EQ(
      transport_->connection_kind(1), mode_.shared_memory ? "shm" : "tcp");
  auto stats = transport_->stats();
  if (mode_.name == "shm") {
    EXPECT_EQ(stats.buffers_via_shm, kMessages);
  } else if (mode_.name == "lanes") {
    // The first large buffer opens the lanes and goes on the connection, as
    // do those sent before the lanes are connected; once they are, each
    // large buffer is cut over them.
    EXPECT_LE(stats.buffers_via_lanes, kMessages - 1);
    uint64_t id = kMessages;
    while (transport_->stats().buffers_via_lanes == 0 && id < 10 * kMessages) {
      ASSERT_TRUE(pipe.send(ping(++id)));
      ASSERT_TRUE(
          inbox_.wait_for([&] { return inbox_.messages.size() == id; }));
    }
    EXPECT_GT(transport_->stats().buffers_via_lanes, 0u);
  } else {
    EXPECT_EQ(stats.buffers_via_shm + stats.buffers_via_lanes, 0u);
  }
}

TEST_P(TransportTest, ASigkilledPeerIsReportedOnceAndLaterSendsAreRefused) {
  Pipe pipe = transport_->pipe_to(1);
  ASSERT_TRUE(pipe.send(ping(1)));
  ASSERT_TRUE(inbox_.wait_for([&] { return inbox_.messages.size() == 1; }));
  auto killed = std::chrono::steady_clock::now();
  peer_->signal(SIGKILL);
  ASSERT_TRUE(inbox_.wait_for([&] { return !inbox_.closed.empty(); }))
      << "the loss was not reported";
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s);
  std::string why_not;
  EXPECT_FALSE(pipe.send(ping(2), &why_not));
  EXPECT_FALSE(why_not.empty());
  std::lock_guard lock(inbox_.mutex);
  EXPECT_EQ(inbox_.closed.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds,
    TransportTest,
    ::testing::Values("shm", "tcp", "lanes"),
    [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tide::transport

namespace tide::test {

void run_transport_peer_if_requested() {
  const char* mode = std::getenv("TIDE_TRANSPORT_TEST_PEER");
  if (mode == nullptr) {
    return;
  }
  using namespace tide::transport;
  Transport echo(
      options_for(mode_named(mode), 1),
      {.on_message = [](const Pipe& pipe,
                        Message m) { pipe.send(std::move(m)); },
       .on_closed = [](const Pipe&, const std::string&) {}});
  std::printf(
      "ready %d %s\n",
      static_cast<int>(echo.port()),
      echo.local_name().empty() ? "-" : echo.local_name().c_str());
  std::fflush(stdout);
  for (;;) {
    ::pause();
  }
}

}  // namespace tide::test
