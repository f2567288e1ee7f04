#pragma once

#include <memory>

#include "tide/store/store.h"

namespace tide::store {

// An in-process Store (torch's HashStore): a map behind a mutex, for
// threads of one process and for tests. Waiters are woken by a condition
// variable, not polling.
std::shared_ptr<Store> make_hash_store();

}  // namespace tide::store
