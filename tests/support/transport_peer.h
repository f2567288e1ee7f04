#pragma once

// A transport in a child process for tests/transport/transport_test.cpp:
// when TIDE_TRANSPORT_TEST_PEER names a mode, runs an echo peer and never
// returns.
namespace tide::test {

void run_transport_peer_if_requested();

}  // namespace tide::test
