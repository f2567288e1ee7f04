// The call table both rpc front ends share (rpc_core/call_table.h), over
// real transports: each way a call ends, each exactly once, and a reply
// counts only from the connection its request went out on.
#include "rpc_core/call_table.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "rpc_core/message_types.h"

namespace tide::rpc_core {
namespace {

using namespace std::chrono_literals;
using Table = CallTable<transport::Message>;
using How = Table::How;

// A peer that keeps every request it gets, for the test to answer.
struct Holder {
  std::mutex mutex;
  std::vector<std::pair<transport::Pipe, uint64_t>> held;  // Guarded.
  std::promise<void> first;

  std::unique_ptr<transport::Transport> transport;

  explicit Holder(int id) {
    transport = std::make_unique<transport::Transport>(
        transport::TransportOptions{
            .self_id = id,
            .self_name = "holder" + std::to_string(id),
            .message_types = cpp_message_types()},
        transport::TransportHandlers{
            .on_message =
                [this](const transport::Pipe& pipe, transport::Message m) {
                  std::lock_guard lock(mutex);
                  held.emplace_back(pipe, m.id);
                  if (held.size() == 1) {
                    first.set_value();
                  }
                },
            .on_closed = [](const transport::Pipe&, const std::string&) {}});
  }
  void wait_first() {
    ASSERT_EQ(first.get_future().wait_for(10s), std::future_status::ready);
  }
};

// A caller with a table, its peers 1 and 2 each a Holder.
struct Caller {
  Holder one{1};
  Holder two{2};
  std::atomic<Table*> books{nullptr};
  transport::Transport transport{
      {.self_id = 0,
       .self_name = "caller",
       .shared_memory = false,
       .message_types = cpp_message_types()},
      {.on_message = [](const transport::Pipe&, transport::Message) {},
       .on_closed =
           [this](const transport::Pipe& pipe, const std::string& why) {
             if (pipe.outgoing() && books.load() != nullptr) {
               books.load()->on_closed(pipe, why);
             }
           }}};
  Table table{transport};

  Caller() {
    books.store(&table);
    transport.set_peers(
        {{1, "holder1", "127.0.0.1", one.transport->port(), "", ""},
         {2, "holder2", "127.0.0.1", two.transport->port(), "", ""}});
  }
  ~Caller() {
    transport.shutdown();
    transport.join();
    table.fail_all("the test ended");
  }

  // Starts a call to `to`; its end is put in `ends`.
  uint64_t call(int to, std::chrono::milliseconds timeout) {
    uint64_t id = table.new_id();
    transport::Message m{MessageType::kRequest, id, "", {Buffer()}};
    table.start(to, std::move(m), timeout, [this](Table::End end) {
      std::lock_guard lock(mutex);
      ends.push_back(std::move(end));
      cv.notify_all();
    });
    return id;
  }
  std::vector<Table::End> wait_ends(size_t n) {
    std::unique_lock lock(mutex);
    EXPECT_TRUE(cv.wait_for(lock, 10s, [&] { return ends.size() >= n; }));
    return std::move(ends);
  }
  size_t ended() {
    std::lock_guard lock(mutex);
    return ends.size();
  }

  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Table::End> ends;  // Guarded by mutex.
};

transport::Message reply_to(uint64_t id) {
  return {MessageType::kResponse, id, "", {Buffer()}};
}

TEST(CallTableTest, AReplyCountsOnlyFromTheConnectionItsRequestWentOn) {
  Caller c;
  uint64_t id = c.call(1, 0ms);
  c.one.wait_first();
  // Worker 2 answering worker 1's call: ignored, the call still waits.
  EXPECT_FALSE(c.table.on_reply(c.transport.pipe_to(2), id, reply_to(id)));
  EXPECT_EQ(c.table.pending(), 1u);
  EXPECT_TRUE(c.table.on_reply(c.transport.pipe_to(1), id, reply_to(id)));
  auto ends = c.wait_ends(1);
  EXPECT_EQ(ends[0].how, How::kReplied);
  EXPECT_EQ(ends[0].reply.id, id);
  // A second answer is late: nothing ends twice.
  EXPECT_FALSE(c.table.on_reply(c.transport.pipe_to(1), id, reply_to(id)));
  EXPECT_EQ(c.table.pending(), 0u);
}

TEST(CallTableTest, ADeadlineEndsTheCallOnceAndALateReplyIsIgnored) {
  Caller c;
  uint64_t id = c.call(1, 20ms);
  auto ends = c.wait_ends(1);
  EXPECT_EQ(ends[0].how, How::kTimedOut);
  EXPECT_FALSE(c.table.on_reply(c.transport.pipe_to(1), id, reply_to(id)));
  EXPECT_EQ(c.ended(), 0u);
}

TEST(CallTableTest, ABadReplyEndsItsCallWithTheReason) {
  Caller c;
  uint64_t id = c.call(1, 0ms);
  EXPECT_TRUE(c.table.on_bad_reply(c.transport.pipe_to(1), id, "garbled"));
  auto ends = c.wait_ends(1);
  EXPECT_EQ(ends[0].how, How::kBadReply);
  EXPECT_EQ(ends[0].reason, "garbled");
}

TEST(CallTableTest, ALostConnectionEndsOnlyItsOwnCalls) {
  Caller c;
  c.call(1, 0ms);
  uint64_t to_two = c.call(2, 0ms);
  c.one.wait_first();
  c.one.transport.reset();  // peer 1 goes away
  auto ends = c.wait_ends(1);
  EXPECT_EQ(ends[0].how, How::kLost);
  EXPECT_FALSE(ends[0].reason.empty());
  EXPECT_EQ(c.table.pending(), 1u);
  EXPECT_TRUE(
      c.table.on_reply(c.transport.pipe_to(2), to_two, reply_to(to_two)));
}

TEST(CallTableTest, ACallToAnUnknownPeerIsNotSentAndSaysWhy) {
  Caller c;
  c.call(7, 1s);
  auto ends = c.wait_ends(1);
  EXPECT_EQ(ends[0].how, How::kNotSent);
  ASSERT_TRUE(ends[0].error);
  EXPECT_THROW(std::rethrow_exception(ends[0].error), InvalidArgument);
  EXPECT_EQ(c.table.pending(), 0u);
}

TEST(CallTableTest, FailAllEndsWhatIsLeftStopped) {
  Caller c;
  c.call(1, 0ms);
  c.call(2, 1h);
  c.table.fail_all("shutting down");
  auto ends = c.wait_ends(2);
  ASSERT_EQ(ends.size(), 2u);
  for (const auto& e : ends) {
    EXPECT_EQ(e.how, How::kStopped);
    EXPECT_EQ(e.reason, "shutting down");
  }
  EXPECT_EQ(c.table.pending(), 0u);
}

}  // namespace
}  // namespace tide::rpc_core
