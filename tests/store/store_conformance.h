#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "tide/store/store.h"

// The Store conformance suite (tests/store/store_conformance_test.cpp): one
// set of tests every Store passes. The stores of the store part are
// instantiated there; a store of a part above (etcd's) instantiates the
// suite in that part's tests.
namespace tide::store::conformance {

// A store under test, and a way to open another client of the same store.
struct Backend {
  std::shared_ptr<Store> store;
  std::function<std::shared_ptr<Store>()> another_client;
};

struct BackendKind {
  std::string name;
  std::function<Backend()> make;
};

inline void PrintTo(const BackendKind& kind, std::ostream* os) {
  *os << kind.name;
}

class StoreConformanceTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    store_ = backend_.store;
  }
  Backend backend_;
  std::shared_ptr<Store> store_;
};

}  // namespace tide::store::conformance
