#pragma once

#include <cstddef>
#include <string>

namespace tide {

// `length` characters of [a-z0-9] from the system's random source, for
// names that must not collide across processes and hosts (log directories,
// run ids, socket names). Thread safe.
std::string random_id(size_t length);

// A random (version 4) UUID in its text form.
std::string uuid4();

}  // namespace tide
