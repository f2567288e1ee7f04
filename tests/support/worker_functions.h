#pragma once

// C++ worker functions for the agent tests, registered in every process of
// the test binary (the spawn start method re-executes it).
namespace tide::test {

// "rank": returns "RANK/WORLD_SIZE/restart count".
// "fail_first_attempt": throws std::runtime_error on attempt 0 at local rank
//   1, else returns "ok".
// "throw": throws std::invalid_argument("bad input").
// "exit_code": exits with the code in its first argument.
void register_worker_functions();

}  // namespace tide::test
