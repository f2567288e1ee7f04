#pragma once

#include <cstdint>
#include <string>

#include "tide/common/fd.h"

#include "common/clock.h"

// Blocking TCP sockets with deadlines, for the clients that need no event
// loop (the store client, tests, benchmarks).
namespace tide::net {

// Connects to host:port (a name or an address; each address it resolves to
// is tried in turn, at most 5 s each) before `deadline`. Returns the
// connected, non-blocking, TCP_NODELAY socket, or an empty Fd with `error`
// saying why the last attempt failed. Never throws.
Fd connect_tcp(
    const std::string& host,
    uint16_t port,
    Clock::time_point deadline,
    std::string& error);

// A TCP port free on `host` (an IPv4 address) right now: bound, read back
// and released, so another process may take it before the caller does.
// Throws NetworkError when no socket can be bound.
uint16_t free_port(const std::string& host = "0.0.0.0");

}  // namespace tide::net
