#pragma once

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

// How far this process's resident memory rose above what it was at
// construction, at its peak: for tests that hold a server (running in the
// test process) to a memory bound while a peer tries to exhaust it.
namespace tide::test {

// A bound on PeakMemory::growth() stated for a plain build, as it holds
// under ThreadSanitizer, whose shadow of each new allocation counts in the
// resident size too (about four times the plain figure where a test
// allocates large buffers over and over).
constexpr uint64_t memory_bound(uint64_t plain) {
#if defined(__SANITIZE_THREAD__)
  return 4 * plain;
#else
  return plain;
#endif
}

class PeakMemory {
 public:
  PeakMemory() {
    // "5" makes the kernel restart VmHWM from VmRSS (Linux >= 4.0).
    std::ofstream("/proc/self/clear_refs") << "5";
    base_ = field("VmRSS");
    EXPECT_LE(field("VmHWM"), base_ + (4 << 20)) << "VmHWM was not reset";
  }
  uint64_t growth() const {
    uint64_t peak = field("VmHWM");
    return peak > base_ ? peak - base_ : 0;
  }

 private:
  static uint64_t field(std::string_view name) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.starts_with(name) && line[name.size()] == ':') {
        return std::stoull(line.substr(name.size() + 1)) * 1024;  // kB
      }
    }
    throw std::runtime_error(
        "no " + std::string(name) + " in /proc/self/status");
  }
  uint64_t base_ = 0;
};

}  // namespace tide::test
