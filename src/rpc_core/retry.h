#pragma once

#include <chrono>
#include <exception>
#include <functional>

#include "tide/common/future.h"

#include "transport/transport.h"

// The one retry of the rpc layers, for idempotent control messages (an
// RRef's fork, accept and delete; a distributed autograd context's
// release): an attempt that fails with an error the caller deems passing (a
// timeout, a connection lost to a peer that lives) is made again after a
// pause that grows, on the transport's timers (no thread of its own).
namespace tide::rpc_core {

struct RetryPolicy {
  int tries = 5;
  // The pause after try n (from 0) is first_pause * growth^n: 0.5 s, 0.75 s,
  // 1.125 s, 1.69 s.
  std::chrono::milliseconds first_pause{500};
  double growth = 1.5;
};

// Makes attempt() until its future succeeds, fails with an error that
// `again` refuses, or the tries run out; the returned future completes
// with the last attempt's outcome. `on_retry(try, pause)` runs before each
// pause (for logs, counts). `transport` must outlive the retries: `again`
// refuses once the caller shuts down. Thread safe.
Future<void> retry(
    transport::Transport& transport,
    std::function<Future<void>()> attempt,
    std::function<bool(const std::exception_ptr&)> again,
    std::function<void(int, std::chrono::milliseconds)> on_retry = {},
    RetryPolicy policy = {});

}  // namespace tide::rpc_core
