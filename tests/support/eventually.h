#pragma once

#include <chrono>
#include <thread>

// Polls `condition` until it holds or `timeout` passes, and says whether it
// held: for what a test can observe only by looking again (a file, a
// process's state, a store key), never as a delay. The timeout is the
// test's bound on a hang, so make it generous: a loaded machine is slow,
// and a condition that holds returns at once.
namespace tide::test {

template <typename Condition>
bool eventually(
    Condition condition,
    std::chrono::milliseconds timeout = std::chrono::seconds(30),
    std::chrono::milliseconds step = std::chrono::milliseconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition()) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(step);
  }
}

}  // namespace tide::test
