#pragma once

#include <string>

namespace tide {

// This host's fully qualified name as Python's socket.getfqdn() gives it
// (the name torch puts in failure reports and events): among the names the
// host's address maps back to, the first with a dot, else the primary one.
// Looked up once; thread safe.
const std::string& fqdn();

}  // namespace tide
