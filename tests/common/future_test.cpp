#include "tide/common/future.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace tide {
namespace {

using std::chrono::milliseconds;

TEST(FutureTest, WaitReturnsValueSetOnAnotherThread) {
  Promise<int> p;
  Future<int> f = p.get_future();
  std::jthread t([p]() mutable { p.set_value(42); });
  EXPECT_EQ(f.wait(milliseconds(5000)), 42);
}

TEST(FutureTest, WaitThrowsTimeoutErrorWhenNotCompleted) {
  Promise<int> p;
  EXPECT_THROW(p.get_future().wait(milliseconds(10)), TimeoutError);
  EXPECT_FALSE(p.get_future().ready());
}

TEST(FutureTest, WaitRethrowsTheStoredError) {
  Promise<std::string> p;
  p.set_error(NetworkError("peer lost"));
  try {
    p.get_future().wait(milliseconds(10));
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_STREQ(e.what(), "peer lost");
  }
}

TEST(FutureTest, ThenRunsInlineWhenAlreadyComplete) {
  auto f = Future<int>::make_ready(2);
  bool ran = false;
  auto g = f.then([&](const int& v) {
    ran = true;
    return v * 10;
  });
  EXPECT_TRUE(ran);
  EXPECT_EQ(g.wait(milliseconds(0)), 20);
}

TEST(FutureTest, ThenRunsOnceOnTheCompletingThread) {
  Promise<int> p;
  std::atomic<int> calls{0};
  std::thread::id ran_on;
  auto g = p.get_future().then([&](const int& v) {
    ++calls;
    ran_on = std::this_thread::get_id();
    return std::to_string(v);
  });
  std::thread::id producer;
  std::jthread t([&, p]() mutable {
    producer = std::this_thread::get_id();
    p.set_value(7);
    p.set_value(8);  // Second completion is ignored.
  });
  t.join();
  EXPECT_EQ(g.wait(milliseconds(1000)), "7");
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(ran_on, producer);
}

TEST(FutureTest, ErrorsSkipContinuationsAndPropagate) {
  Promise<int> p;
  bool ran = false;
  auto g = p.get_future()
               .then([&](const int& v) {
                 ran = true;
                 return v + 1;
               })
               .then([](const int& v) { return v * 2; });
  p.set_error(TimeoutError("too slow"));
  EXPECT_FALSE(ran);
  EXPECT_THROW(g.wait(milliseconds(10)), TimeoutError);
}

TEST(FutureTest, ExceptionInContinuationFailsTheNextFuture) {
  auto g = Future<int>::make_ready(1).then(
      [](const int&) -> int { throw InvalidArgument("bad"); });
  EXPECT_THROW(g.wait(milliseconds(10)), InvalidArgument);
}

TEST(FutureTest, VoidFuturesChain) {
  Promise<void> p;
  auto g = p.get_future().then([] { return 5; });
  p.set_value();
  EXPECT_EQ(g.wait(milliseconds(10)), 5);
  Future<void>::make_ready().wait(milliseconds(0));
}

TEST(FutureTest, DroppedPromiseFailsItsFuture) {
  Future<int> f = [] {
    Promise<int> p;
    return p.get_future();
  }();
  EXPECT_THROW(f.wait(milliseconds(1000)), Error);
}

TEST(FutureTest, OnlyTheLastCopyOfAPromiseFailsItsFutureWhenDropped) {
  auto p = std::make_unique<Promise<int>>();
  Future<int> f = p->get_future();
  auto copy = std::make_unique<Promise<int>>(*p);
  Promise<int> moved = std::move(*p);
  p.reset();
  copy.reset();
  EXPECT_FALSE(f.ready());  // `moved` still holds it.
  Promise<int> other;
  Future<int> g = other.get_future();
  other = moved;  // `other`'s own future loses its last promise.
  EXPECT_THROW(g.wait(milliseconds(0)), Error);
  moved = Promise<int>();
  EXPECT_FALSE(f.ready());  // `other` holds it now.
  EXPECT_TRUE(other.set_value(7));
  EXPECT_EQ(f.wait(milliseconds(0)), 7);
}

TEST(FutureTest, OnCompleteSeesValueAndErrorExactlyOnce) {
  Promise<int> ok;
  Promise<int> bad;
  int ok_calls = 0;
  int bad_calls = 0;
  ok.get_future().on_complete([&](const Future<int>& f) {
    ++ok_calls;
    EXPECT_EQ(f.wait(milliseconds(0)), 3);
  });
  bad.get_future().on_complete([&](const Future<int>& f) {
    ++bad_calls;
    EXPECT_NE(f.error(), nullptr);
  });
  ok.set_value(3);
  bad.set_error(Error("x"));
  ok.set_value(4);
  EXPECT_EQ(ok_calls, 1);
  EXPECT_EQ(bad_calls, 1);
}

TEST(FutureTest, ManyWaitersAllWake) {
  Promise<int> p;
  auto f = p.get_future();
  std::atomic<int> woke{0};
  {
    std::vector<std::jthread> waiters;
    for (int i = 0; i < 8; ++i) {
      waiters.emplace_back([&] {
        if (f.wait(milliseconds(5000)) == 9) {
          ++woke;
        }
      });
    }
    p.set_value(9);
  }
  EXPECT_EQ(woke.load(), 8);
}

TEST(FutureTest, WhenAllWaitsForEveryFutureAndKeepsTheFirstError) {
  EXPECT_TRUE(when_all({}).ready());
  Promise<void> a;
  Promise<void> b;
  Promise<void> c;
  Future<void> all = when_all({a.get_future(), b.get_future(), c.get_future()});
  b.set_error(InvalidArgument("b failed"));
  a.set_value();
  EXPECT_FALSE(all.ready());  // c is still out
  c.set_error(TimeoutError("c failed"));
  ASSERT_TRUE(all.ready());
  EXPECT_THROW(all.wait(milliseconds(0)), InvalidArgument);
  Promise<void> d;
  Future<void> one = when_all({d.get_future()});
  d.set_value();
  EXPECT_NO_THROW(one.wait(milliseconds(0)));
}

}  // namespace
}  // namespace tide
