// The rpc layers' one retry (rpc_core/retry.h): passing errors are tried
// again after growing pauses on the transport's timers, others end it, and
// a transport that shuts down ends a pause with an error, not a hang.
#include "rpc_core/retry.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::rpc_core {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<transport::Transport> make_transport() {
  return std::make_unique<transport::Transport>(
      transport::TransportOptions{.self_id = 0, .self_name = "retry"},
      transport::TransportHandlers{
          .on_message = [](const transport::Pipe&, transport::Message) {},
          .on_closed = [](const transport::Pipe&, const std::string&) {}});
}

// The error that passes here (not TimeoutError: a wait that runs out
// throws that).
bool lost_only(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const NetworkError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// Waits for f and returns the text of its error ("" when it succeeded);
// fails the test when it does not complete in time.
std::string outcome(const Future<void>& f) {
  try {
    f.wait(10s);
    return "";
  } catch (const std::exception& e) {
    EXPECT_TRUE(f.ready()) << "still pending: " << e.what();
    return e.what();
  }
}

// An attempt that fails with `error` its first `failures` times.
std::function<Future<void>()> failing(
    std::atomic<int>& made, int failures, std::exception_ptr error) {
  return [&made, failures, error] {
    if (made.fetch_add(1) < failures) {
      return Future<void>::make_failed(error);
    }
    return Future<void>::make_ready();
  };
}

TEST(RetryTest, PassingErrorsAreTriedAgainAfterGrowingPauses) {
  auto t = make_transport();
  std::atomic<int> made{0};
  std::vector<std::chrono::milliseconds> pauses;
  Future<void> f = retry(
      *t,
      failing(made, 2, std::make_exception_ptr(NetworkError("lost"))),
      lost_only,
      [&](int, std::chrono::milliseconds pause) { pauses.push_back(pause); },
      {.tries = 5, .first_pause = 4ms, .growth = 2.0});
  EXPECT_EQ(outcome(f), "");
  EXPECT_EQ(made.load(), 3);
  EXPECT_EQ(pauses, (std::vector<std::chrono::milliseconds>{4ms, 8ms}));
}

TEST(RetryTest, AnErrorNotToRetryEndsItAtOnce) {
  auto t = make_transport();
  std::atomic<int> made{0};
  Future<void> f = retry(
      *t,
      failing(made, 9, std::make_exception_ptr(InvalidArgument("no"))),
      lost_only,
      {},
      {.first_pause = 1ms});
  EXPECT_EQ(outcome(f), "no");
  EXPECT_EQ(made.load(), 1);
}

TEST(RetryTest, GivesUpAfterItsTriesWithTheLastError) {
  auto t = make_transport();
  std::atomic<int> made{0};
  Future<void> f = retry(
      *t,
      failing(made, 9, std::make_exception_ptr(NetworkError("lost"))),
      lost_only,
      {},
      {.tries = 3, .first_pause = 1ms});
  EXPECT_EQ(outcome(f), "lost");
  EXPECT_EQ(made.load(), 3);
}

TEST(RetryTest, AnAttemptThatThrowsCountsAsFailed) {
  auto t = make_transport();
  Future<void> f = retry(
      *t, []() -> Future<void> { throw InvalidArgument("bad"); }, lost_only);
  EXPECT_EQ(outcome(f), "bad");
}

TEST(RetryTest, AShutdownDuringAPauseFailsItInsteadOfHanging) {
  auto t = make_transport();
  std::atomic<int> made{0};
  Future<void> f = retry(
      *t,
      failing(made, 9, std::make_exception_ptr(NetworkError("lost"))),
      lost_only,
      {},
      {.first_pause = 1h});
  t->shutdown();
  t->join();
  EXPECT_EQ(
      outcome(f), "promise dropped without a result; the producer went away");
  EXPECT_EQ(made.load(), 1);
}

}  // namespace
}  // namespace tide::rpc_core
