#include "tide/common/host.h"

#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <vector>

namespace tide {

namespace {

std::string lookup_fqdn() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  std::string name = buf;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 ||
      res == nullptr) {
    return name;
  }
  hostent entry{};
  hostent* found = nullptr;
  char scratch[4096];
  int err = 0;
  const void* addr = nullptr;
  socklen_t len = 0;
  if (res->ai_family == AF_INET) {
    addr = &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    len = sizeof(in_addr);
  } else {
    addr = &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr;
    len = sizeof(in6_addr);
  }
  ::gethostbyaddr_r(
      addr, len, res->ai_family, &entry, scratch, sizeof scratch, &found, &err);
  ::freeaddrinfo(res);
  if (found == nullptr) {
    return name;
  }
  std::vector<std::string> names{found->h_name};
  for (char** a = found->h_aliases; a && *a; ++a) {
    names.emplace_back(*a);
  }
  for (const auto& n : names) {
    if (n.find('.') != std::string::npos) {
      return n;
    }
  }
  return names.front();
}

}  // namespace

const std::string& fqdn() {
  static const std::string name = lookup_fqdn();
  return name;
}

}  // namespace tide
