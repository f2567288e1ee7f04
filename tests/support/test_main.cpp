// main() of tide_unit_tests and tide_app_tests: registers the worker functions
// the agent tests use, lets a spawned worker run its function, then runs the
// tests.
#include <gtest/gtest.h>

#include "tide/agent/entrypoint.h"

#include "support/rpc_child.h"
#include "support/transport_peer.h"
#include "support/worker_functions.h"

int main(int argc, char** argv) {
  tide::test::register_worker_functions();
  tide::agent::run_worker_if_spawned(argc, argv);
#ifdef TIDE_UNIT_TESTS
  // Children of the rpc and transport tests, which only the unit tests hold.
  tide::test::run_rpc_child_if_requested();
  tide::test::run_rpc_transport_child_if_requested();
  tide::test::run_rref_child_if_requested();
  tide::test::run_transport_peer_if_requested();
#endif
  tide::test::run_security_child_if_requested();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
