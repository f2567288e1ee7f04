// The Store conformance suite (tests/store/store_conformance.h) on
// EtcdStore.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tide/etcd/etcd_store.h"

#include "store/store_conformance.h"
#include "support/etcd.h"

namespace tide::store::conformance {
namespace {

using namespace std::chrono_literals;

// One etcd for every EtcdStore test (starting one takes about a second);
// each test gets keys under a prefix of its own. Started by the first test
// that needs it, on the main thread, and killed at exit.
const test::EtcdCluster& shared_etcd() {
  static const test::EtcdCluster cluster = test::EtcdCluster::start(1);
  return cluster;
}

Backend etcd_backend() {
  static std::atomic<int> next_prefix{0};
  std::string endpoints = shared_etcd().endpoints();
  std::string prefix = "/conformance/" + std::to_string(next_prefix++);
  auto make = [endpoints, prefix] {
    return std::make_shared<etcd::EtcdStore>(endpoints, prefix, 10s);
  };
  return {make(), make};
}

INSTANTIATE_TEST_SUITE_P(
    Etcd,
    StoreConformanceTest,
    ::testing::Values(BackendKind{"EtcdStore", etcd_backend}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tide::store::conformance
