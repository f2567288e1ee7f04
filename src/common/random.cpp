#include "common/random.h"

#include <cinttypes>
#include <cstdio>
#include <random>

namespace tide {

std::string random_id(size_t length) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::uniform_int_distribution<size_t> pick(0, sizeof kChars - 2);
  std::string s;
  s.reserve(length);
  for (size_t i = 0; i < length; ++i) {
    s.push_back(kChars[pick(rd)]);
  }
  return s;
}

std::string uuid4() {
  std::random_device rd;
  auto word = [&] { return (uint64_t{rd()} << 32) | rd(); };
  uint64_t a = (word() & 0xFFFFFFFFFFFF0FFFull) | 0x0000000000004000ull;
  uint64_t b = (word() & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull;
  char buf[37];
  std::snprintf(
      buf,
      sizeof buf,
      "%08" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%012" PRIx64,
      a >> 32,
      (a >> 16) & 0xFFFF,
      a & 0xFFFF,
      b >> 48,
      b & uint64_t{0xFFFFFFFFFFFF});
  return buf;
}

}  // namespace tide
