// The transport's timers (Transport::schedule), on the transport's own API:
// any number of them behind one asio timer, in time order, cancellable,
// dropped unrun at shutdown.
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "transport/transport.h"

namespace tide::transport {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Transport> make_transport() {
  return std::make_unique<Transport>(
      TransportOptions{.self_id = 0, .self_name = "timers"},
      TransportHandlers{
          .on_message = [](const Pipe&, Message) {},
          .on_closed = [](const Pipe&, const std::string&) {}});
}

// Records which timers ran, and lets a test wait for the n-th.
struct Ran {
  std::mutex mutex;
  std::vector<int> order;  // Guarded by mutex.
  std::promise<void> enough;
  size_t want = 0;

  std::function<void()> mark(int which) {
    return [this, which] {
      std::lock_guard lock(mutex);
      order.push_back(which);
      if (order.size() == want) {
        enough.set_value();
      }
    };
  }
  std::vector<int> wait() {
    EXPECT_EQ(enough.get_future().wait_for(10s), std::future_status::ready);
    std::lock_guard lock(mutex);
    return order;
  }
};

TEST(TimersTest, RunInTimeOrderWhateverOrderTheyCame) {
  auto t = make_transport();
  Ran ran;
  ran.want = 4;
  auto now = Clock::now();
  t->schedule(now + 30ms, ran.mark(3));
  t->schedule(now + 10ms, ran.mark(1));
  t->schedule(now + 20ms, ran.mark(2));
  t->schedule(now - 1s, ran.mark(0));  // past already: at once
  EXPECT_EQ(ran.wait(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(TimersTest, AnEarlierTimerIsNotHeldBehindALaterOne) {
  auto t = make_transport();
  Ran ran;
  ran.want = 1;
  t->schedule(Clock::now() + 1h, ran.mark(2));
  t->schedule(Clock::now() + 5ms, ran.mark(1));
  EXPECT_EQ(ran.wait(), std::vector<int>{1});
}

TEST(TimersTest, ACancelledTimerNeverRuns) {
  auto t = make_transport();
  Ran ran;
  ran.want = 1;
  Timer dropped = t->schedule(Clock::now() + 10ms, ran.mark(1));
  EXPECT_TRUE(dropped.cancel());
  EXPECT_FALSE(dropped.cancel());
  Timer kept = t->schedule(Clock::now() + 30ms, ran.mark(2));
  EXPECT_EQ(ran.wait(), std::vector<int>{2});
  EXPECT_FALSE(kept.cancel());  // it ran
  EXPECT_FALSE(Timer().cancel());
  EXPECT_FALSE(t->schedule(Clock::time_point::max(), ran.mark(3)).cancel());
}

TEST(TimersTest, ShutdownDropsWaitingTimersUnrunAndLaterOnesAreIgnored) {
  auto t = make_transport();
  auto held = std::make_shared<int>(0);
  bool ran = false;
  Timer waiting = t->schedule(Clock::now() + 1h, [held, &ran] { ran = true; });
  EXPECT_EQ(held.use_count(), 2);
  t->shutdown();
  t->join();
  EXPECT_EQ(held.use_count(), 1);  // dropped with what it held
  EXPECT_FALSE(waiting.cancel());
  t->schedule(Clock::now(), [held, &ran] { ran = true; });
  EXPECT_EQ(held.use_count(), 1);
  t.reset();
  EXPECT_FALSE(waiting.cancel());  // harmless after the transport is gone
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace tide::transport
