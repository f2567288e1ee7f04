// The walk over a peer's pickle before torch's unpickler sees it: pickles
// Python and torch write pass; lengths, frames and memo indices that claim
// more than came are refused, naming the opcode.
#include "torch_rpc/pickle_check.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::torch_rpc {
namespace {

using ::testing::HasSubstr;

// pickle.dumps([1, 'ab', b'xy', 2.5, (None, True), {'k': [1]}, 10**30],
// protocol=2 and 5).
const std::string kProtocol2(
    "\x80\x02\x5d\x71\x00\x28\x4b\x01\x58\x02\x00\x00\x00\x61\x62\x71\x01\x63"
    "\x5f\x63\x6f\x64\x65\x63\x73\x0a\x65\x6e\x63\x6f\x64\x65\x0a\x71\x02\x58"
    "\x02\x00\x00\x00\x78\x79\x71\x03\x58\x06\x00\x00\x00\x6c\x61\x74\x69\x6e"
    "\x31\x71\x04\x86\x71\x05\x52\x71\x06\x47\x40\x04\x00\x00\x00\x00\x00\x00"
    "\x4e\x88\x86\x71\x07\x7d\x71\x08\x58\x01\x00\x00\x00\x6b\x71\x09\x5d\x71"
    "\x0a\x4b\x01\x61\x73\x8a\x0d\x00\x00\x00\x40\xea\xed\x74\x46\xd0\x9c\x2c"
    "\x9f\x0c\x65\x2e",
    112);
const std::string kProtocol5(
    "\x80\x05\x95\x39\x00\x00\x00\x00\x00\x00\x00\x5d\x94\x28\x4b\x01\x8c\x02"
    "\x61\x62\x94\x43\x02\x78\x79\x94\x47\x40\x04\x00\x00\x00\x00\x00\x00\x4e"
    "\x88\x86\x94\x7d\x94\x8c\x01\x6b\x94\x5d\x94\x4b\x01\x61\x73\x8a\x0d\x00"
    "\x00\x00\x40\xea\xed\x74\x46\xd0\x9c\x2c\x9f\x0c\x65\x2e",
    68);

std::string refusal(const std::string& pickle) {
  try {
    check_pickle(pickle);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

TEST(PickleCheckTest, PicklesPythonWritesPass) {
  EXPECT_EQ(refusal(kProtocol2), "");
  EXPECT_EQ(refusal(kProtocol5), "");
}

TEST(PickleCheckTest, AMemoIndexNeverPutIsRefused) {
  // 14 bytes that had torch's unpickler grow its memo to 16 million entries.
  std::string p("\x80\x02N\x72\x00\x00\x00\x01N\x68\x00.", 12);
  EXPECT_THAT(refusal(p), HasSubstr("puts memo entry 16777216 with 0 put"));
  EXPECT_THAT(
      refusal(std::string("\x80\x02\x68\x03.", 5)),
      HasSubstr("gets memo entry 3, never put"));
  EXPECT_THAT(refusal("\x80\x02g7\n."), HasSubstr("never put"));
}

TEST(PickleCheckTest, LengthsPastTheBytesThatCameAreRefused) {
  EXPECT_THAT(
      refusal(std::string(
          "\x80\x02X\xff\xff\xff\x7f"
          "ab.",
          10)),
      HasSubstr("claims 2147483647 bytes, and 3 are left"));
  EXPECT_THAT(
      refusal(std::string("\x80\x04\x95\x00\x00\x00\x00\x01\x00\x00\x00.", 12)),
      HasSubstr("(FRAME) claims"));
  EXPECT_THAT(
      refusal(std::string("\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x10", 11)),
      HasSubstr("claims"));
  EXPECT_THAT(refusal(std::string("\x80", 1)), HasSubstr("cut short"));
  EXPECT_THAT(
      refusal("\x80\x02"
              "cmod\nname"),
      HasSubstr("no end of line"));
}

TEST(PickleCheckTest, UnknownOpcodesTrailingBytesAndNoStopAreRefused) {
  EXPECT_THAT(
      refusal(std::string("\x80\x02\xff.", 4)),
      HasSubstr("opcode 0xff at byte 2 is not a pickle opcode"));
  EXPECT_THAT(refusal("\x80\x02N.N"), HasSubstr("has bytes after it"));
  EXPECT_THAT(refusal("\x80\x02N"), HasSubstr("no STOP"));
  EXPECT_THAT(refusal(""), HasSubstr("no STOP"));
}

}  // namespace
}  // namespace tide::torch_rpc
