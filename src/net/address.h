#pragma once

#include <cstdint>
#include <string>
#include <string_view>

// Host and port as people write them: "node0:29400", "10.0.0.1:80",
// "[fe80::1]:29400", or a host alone.
namespace tide::net {

struct HostPort {
  std::string host;  // a name or an address, IPv6 without brackets
  uint16_t port = 0;
};

// Parses "host:port", "[v6]:port", "host", "[v6]" or a bare IPv6 address
// (more than one colon: all host). A missing port is `default_port`.
// Throws InvalidArgument naming `text` when the host is empty, a bracket is
// not closed, or the port is not a number from 0 to 65535.
HostPort parse_host_port(std::string_view text, uint16_t default_port);

// The same, with the port required ("tcp://" addresses).
HostPort parse_host_port(std::string_view text);

// A port number, 0 to 65535; InvalidArgument names `what` otherwise.
uint16_t parse_port(std::string_view text, std::string_view what);

// "host:port", with brackets around an IPv6 address.
std::string format_host_port(std::string_view host, uint16_t port);

// Whether host names this machine's loopback ("localhost", 127.0.0.0/8,
// ::1).
bool is_loopback(std::string_view host);

}  // namespace tide::net
