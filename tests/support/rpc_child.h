#pragma once

// A child process of the RPC tests: when the test binary is re-executed with
// TIDE_RPC_TEST_CHILD set, it runs an RPC agent instead of the tests (see
// tests/rpc/rpc_test.cpp) and never returns.
namespace tide::test {

void run_rpc_child_if_requested();
// The same for tests/rpc/transport_test.cpp's children.
void run_rpc_transport_child_if_requested();
// The same for tests/rpc/rref_test.cpp's children.
void run_rref_child_if_requested();
// The same for tests/transport/security_test.cpp's worker under tiderun.
void run_security_child_if_requested();

}  // namespace tide::test
