#pragma once

#include <chrono>

// The rpc metrics of this process (docs/observability.md), counted here for
// both front ends:
//
//   tide_rpc_calls_total{direction="sent"|"received",
//                        outcome="ok"|"error"|"timeout"}
//   tide_rpc_call_seconds{outcome}   the calls sent, from start to end
//   tide_rpc_pending_calls           the calls sent and not yet ended
//
// A sent call is ok when its reply came and says the function returned,
// error when the reply carries the callee's exception or no reply can come
// (lost connection, bad reply, not sent, shut down), timeout when its
// deadline passed. A received call is ok or error as its answer. The call
// table counts the sent calls; each front end counts the calls it answers.
//
// Thread safe, and cheap (a few atomic adds): called once per call.
namespace tide::rpc_core {

enum class Outcome { kOk, kError, kTimeout };

// A call this worker sent started.
void call_started();
// A call this worker sent ended, `took` after it started.
void call_ended(Outcome outcome, std::chrono::steady_clock::duration took);
// This worker answered a call it received: kOk with the function's result,
// kError with its exception (or with why there is none).
void call_served(Outcome outcome);

}  // namespace tide::rpc_core
