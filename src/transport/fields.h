#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tide/common/error.h"

// The metadata of the messages the transport writes itself (handshakes,
// lane hellos, parts, releases): fields in a fixed order, integers
// little-endian, strings and lists after a u32 count. Pure, no I/O. A
// reader that runs short, finds a count past the end, or has bytes left
// over throws ProtocolError naming the message.
namespace tide::transport {

class FieldWriter {
 public:
  FieldWriter& u32(uint32_t v) {
    return put(v);
  }
  FieldWriter& i32(int32_t v) {
    return put(v);
  }
  FieldWriter& u64(uint64_t v) {
    return put(v);
  }
  FieldWriter& i64(int64_t v) {
    return put(v);
  }
  FieldWriter& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  FieldWriter& u64s(const std::vector<uint64_t>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (uint64_t x : v) {
      u64(x);
    }
    return *this;
  }
  std::string take() {
    return std::move(out_);
  }

 private:
  template <typename T>
  FieldWriter& put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof v);  // little-endian hosts only (frame.h)
    out_.append(b, sizeof b);
    return *this;
  }
  std::string out_;
};

class FieldReader {
 public:
  FieldReader(std::string_view in, const char* what) : in_(in), what_(what) {}

  uint32_t u32() {
    return get<uint32_t>();
  }
  int32_t i32() {
    return get<int32_t>();
  }
  uint64_t u64() {
    return get<uint64_t>();
  }
  int64_t i64() {
    return get<int64_t>();
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  std::vector<uint64_t> u64s() {
    uint32_t n = u32();
    need(uint64_t{n} * sizeof(uint64_t));
    std::vector<uint64_t> v(n);
    for (auto& x : v) {
      x = u64();
    }
    return v;
  }
  // Every field was read.
  void end() const {
    if (!in_.empty()) {
      throw ProtocolError(
          std::string(what_) + ": " + std::to_string(in_.size()) +
          " bytes after its last field");
    }
  }

 private:
  void need(uint64_t n) const {
    if (n > in_.size()) {
      throw ProtocolError(
          std::string(what_) + ": a field of " + std::to_string(n) +
          " bytes where " + std::to_string(in_.size()) + " are left");
    }
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data(), sizeof v);
    in_.remove_prefix(sizeof v);
    return v;
  }
  std::string_view in_;
  const char* what_;
};

}  // namespace tide::transport
