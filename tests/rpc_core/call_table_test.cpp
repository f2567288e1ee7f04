// The call table both rpc front ends share (rpc_core/call_table.h), over
// real transports: each way a call ends, each exactly once, a reply counts
// only from the connection its request went out on, and every call is in
// the process's rpc metrics.
#include "rpc_core/call_table.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/metrics/registry.h"

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

// A sample of the process's metrics; 0 before its series is made.
double sample(const std::string& series) {
  return metrics::sample_value(series).value_or(0);
}

TEST(CallTableTest, EveryCallIsInTheProcesssMetricsByOutcome) {
  // The metrics are the process's: compare before and after.
  auto sent = [](const std::string& outcome) {
    return sample(
        "tide_rpc_calls_total{direction=\"sent\",outcome=\"" + outcome + "\"}");
  };
  const double ok = sent("ok");
  const double errors = sent("error");
  const double timeouts = sent("timeout");
  const double pending = sample("tide_rpc_pending_calls");
  const double timed = sample("tide_rpc_call_seconds_count{outcome=\"ok\"}");

  Caller c;
  constexpr int kCalls = 5;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kCalls; ++i) {
    ids.push_back(c.call(1, 0ms));
  }
  EXPECT_EQ(sample("tide_rpc_pending_calls") - pending, kCalls);
  for (uint64_t id : ids) {
    EXPECT_TRUE(c.table.on_reply(c.transport.pipe_to(1), id, reply_to(id)));
  }
  c.wait_ends(kCalls);
  EXPECT_EQ(sent("ok") - ok, kCalls);
  EXPECT_EQ(
      sample("tide_rpc_call_seconds_count{outcome=\"ok\"}") - timed, kCalls);

  // A deadline is a timeout; a bad reply, and a reply that carries the
  // callee's exception, are errors.
  c.call(1, 20ms);
  c.wait_ends(1);
  uint64_t garbled = c.call(1, 0ms);
  EXPECT_TRUE(c.table.on_bad_reply(c.transport.pipe_to(1), garbled, "x"));
  c.wait_ends(1);
  Table with_errors(c.transport, [](const transport::Message& m) {
    return m.type == MessageType::kError;
  });
  std::promise<void> ended;
  uint64_t id = with_errors.new_id();
  with_errors.start(
      1,
      transport::Message{MessageType::kRequest, id, "", {Buffer()}},
      0ms,
      [&ended](Table::End) { ended.set_value(); });
  EXPECT_TRUE(with_errors.on_reply(
      c.transport.pipe_to(1),
      id,
      transport::Message{MessageType::kError, id, "", {}}));
  ASSERT_EQ(ended.get_future().wait_for(10s), std::future_status::ready);

  EXPECT_EQ(sent("timeout") - timeouts, 1);
  EXPECT_EQ(sent("error") - errors, 2);
  EXPECT_EQ(sent("ok") - ok, kCalls);
  EXPECT_EQ(sample("tide_rpc_pending_calls"), pending);
  std::string text = metrics::exposition();
  EXPECT_NE(
      text.find("# TYPE tide_rpc_call_seconds histogram"), std::string::npos);
  EXPECT_NE(
      text.find("# TYPE tide_rpc_calls_total counter"), std::string::npos);
}

}  // namespace
}  // namespace tide::rpc_core
