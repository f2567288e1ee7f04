#include "net/address.h"

#include <arpa/inet.h>

#include <charconv>
#include <optional>

#include "tide/common/error.h"

namespace tide::net {

namespace {

std::string quoted(std::string_view text) {
  return "\"" + std::string(text) + "\"";
}

HostPort parse(std::string_view text, std::optional<uint16_t> default_port) {
  std::string_view host = text;
  std::optional<std::string_view> port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) {
      throw InvalidArgument("address " + quoted(text) + ": missing ']'");
    }
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        throw InvalidArgument(
            "address " + quoted(text) + ": expected ':' after ']'");
      }
      port_text = text.substr(close + 2);
    }
  } else if (auto colon = text.rfind(':');
             colon != std::string_view::npos && text.find(':') == colon) {
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host.empty()) {
    throw InvalidArgument("address " + quoted(text) + " has no host");
  }
  if (!port_text) {
    if (!default_port) {
      throw InvalidArgument(
          "address " + quoted(text) + " has no port; expected host:port");
    }
    return {std::string(host), *default_port};
  }
  uint16_t port = 0;
  try {
    port = parse_port(*port_text, "port");
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("address " + quoted(text) + ": " + e.what());
  }
  return {std::string(host), port};
}

}  // namespace

uint16_t parse_port(std::string_view text, std::string_view what) {
  unsigned port = 0;
  auto [ptr, ec] =
      std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() ||
      port > 65535) {
    throw InvalidArgument(
        std::string(what) + " " + quoted(text) +
        " is not a number from 0 to 65535");
  }
  return static_cast<uint16_t>(port);
}

HostPort parse_host_port(std::string_view text, uint16_t default_port) {
  return parse(text, default_port);
}

HostPort parse_host_port(std::string_view text) {
  return parse(text, std::nullopt);
}

std::string format_host_port(std::string_view host, uint16_t port) {
  bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  out.reserve(host.size() + 8);
  if (v6) {
    out.push_back('[');
  }
  out.append(host);
  if (v6) {
    out.push_back(']');
  }
  out.push_back(':');
  out.append(std::to_string(port));
  return out;
}

bool is_loopback(std::string_view host) {
  if (host == "localhost") {
    return true;
  }
  std::string h(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  return ::inet_pton(AF_INET6, h.c_str(), &v6) == 1 &&
         IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace tide::net
