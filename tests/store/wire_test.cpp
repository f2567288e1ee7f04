#include "store/wire.h"

#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::store::wire {
namespace {

std::string set_request(
    Dialect d, std::string_view key, std::string_view value) {
  std::string out;
  Writer(out).u8(*op_code(Op::kSet, d)).str(key).str(value);
  return out;
}

TEST(WireTest, CodesMatchTorchInBothDialects) {
  EXPECT_EQ(op_code(Op::kSet, Dialect::kLegacy), 0);
  EXPECT_EQ(op_code(Op::kWait, Dialect::kLegacy), 5);
  EXPECT_EQ(op_code(Op::kNumKeys, Dialect::kLegacy), 6);
  EXPECT_EQ(op_code(Op::kDeleteKey, Dialect::kLegacy), 8);
  EXPECT_EQ(op_code(Op::kValidate, Dialect::kModern), 0);
  EXPECT_EQ(op_code(Op::kSet, Dialect::kModern), 1);
  EXPECT_EQ(op_code(Op::kNumKeys, Dialect::kModern), 7);
  EXPECT_EQ(op_code(Op::kDeleteKey, Dialect::kModern), 8);
  EXPECT_EQ(op_code(Op::kPing, Dialect::kModern), 13);
  EXPECT_FALSE(op_code(Op::kPing, Dialect::kLegacy).has_value());
  EXPECT_FALSE(op_from_code(7, Dialect::kLegacy).has_value());  // WATCH_KEY
}

TEST(WireTest, DecodesAWholeRequestAndReportsItsLength) {
  std::string bytes = set_request(Dialect::kLegacy, "/k", "value");
  bytes += "trailing";
  Request req;
  Decoded d = decode_request(bytes, Dialect::kLegacy, StoreLimits{}, req);
  EXPECT_EQ(d.consumed, 1 + 8 + 2 + 8 + 5);
  EXPECT_EQ(req.op, Op::kSet);
  EXPECT_EQ(req.keys, std::vector<std::string>{"/k"});
  EXPECT_EQ(req.values, std::vector<std::string>{"value"});
}

TEST(WireTest, EveryPrefixOfARequestIsIncompleteWithAGrowingNeed) {
  std::string bytes = set_request(Dialect::kModern, "/key", "some value");
  for (size_t n = 0; n < bytes.size(); ++n) {
    Request req;
    Decoded d = decode_request(
        bytes.substr(0, n), Dialect::kModern, StoreLimits{}, req);
    EXPECT_EQ(d.consumed, 0u) << n;
    EXPECT_GT(d.need, n) << n;
    EXPECT_LE(d.need, bytes.size()) << n;
  }
}

TEST(WireTest, OverlongKeyIsRejectedFromItsLengthAlone) {
  std::string bytes;
  Writer(bytes).u8(0).u64(1'000'000);  // SET, key length only
  Request req;
  EXPECT_THROW(
      decode_request(bytes, Dialect::kLegacy, StoreLimits{}, req),
      ProtocolError);
}

TEST(WireTest, TooManyKeysIsRejected) {
  std::string bytes;
  Writer(bytes).u8(*op_code(Op::kWait, Dialect::kLegacy)).u64(1u << 30);
  Request req;
  EXPECT_THROW(
      decode_request(bytes, Dialect::kLegacy, StoreLimits{}, req),
      ProtocolError);
}

TEST(WireTest, RequestsOverTheTotalLimitAreRejected) {
  StoreLimits limits{.max_request_bytes = 100};
  std::string bytes;
  Writer w(bytes);
  w.u8(*op_code(Op::kMultiSet, Dialect::kModern)).u64(3);
  for (int i = 0; i < 3; ++i) {
    w.str("k").str(std::string(60, 'v'));
  }
  Request req;
  EXPECT_THROW(
      decode_request(bytes, Dialect::kModern, limits, req), ProtocolError);
}

TEST(WireTest, UnknownCodesAreRejected) {
  Request req;
  EXPECT_THROW(
      decode_request("G", Dialect::kLegacy, StoreLimits{}, req), ProtocolError);
  EXPECT_THROW(
      decode_request("\x40", Dialect::kModern, StoreLimits{}, req),
      ProtocolError);
}

TEST(WireTest, DetectsTheModernDialectByItsMagic) {
  std::string validate;
  Writer(validate).u8(0).u32(kValidateMagic);
  EXPECT_EQ(detect_dialect(validate), Dialect::kModern);
  EXPECT_EQ(detect_dialect(validate.substr(0, 3)), std::nullopt);
  EXPECT_EQ(
      detect_dialect(set_request(Dialect::kLegacy, "/a", "b")),
      Dialect::kLegacy);
  EXPECT_EQ(detect_dialect("\x05"), Dialect::kLegacy);
  EXPECT_EQ(detect_dialect(""), std::nullopt);
}

TEST(WireTest, DecodesEveryArgumentShape) {
  std::string bytes;
  Writer w(bytes);
  w.u8(*op_code(Op::kCompareSet, Dialect::kModern)).str("/k").str("e").str("d");
  w.u8(*op_code(Op::kAdd, Dialect::kModern)).str("/c").i64(-7);
  w.u8(*op_code(Op::kCheck, Dialect::kModern)).u64(2).str("/a").str("/b");
  w.u8(*op_code(Op::kPing, Dialect::kModern)).u32(99);
  w.u8(*op_code(Op::kNumKeys, Dialect::kModern));
  std::string_view rest = bytes;
  Request req;
  auto next = [&] {
    Decoded d = decode_request(rest, Dialect::kModern, StoreLimits{}, req);
    EXPECT_GT(d.consumed, 0u);
    rest.remove_prefix(d.consumed);
  };
  next();
  EXPECT_EQ(req.op, Op::kCompareSet);
  EXPECT_EQ(req.values, (std::vector<std::string>{"e", "d"}));
  next();
  EXPECT_EQ(req.op, Op::kAdd);
  EXPECT_EQ(req.delta, -7);
  next();
  EXPECT_EQ(req.keys, (std::vector<std::string>{"/a", "/b"}));
  next();
  EXPECT_EQ(req.number, 99u);
  next();
  EXPECT_EQ(req.op, Op::kNumKeys);
  EXPECT_TRUE(rest.empty());
}

TEST(WireTest, AnAddWaitDecodesAndItsReplyRoundTrips) {
  Request req{
      .op = Op::kAddWait, .keys = {"/votes", "/done"}, .delta = 1, .target = 64};
  std::string bytes;
  encode_request(req, Dialect::kModern, bytes);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), kAddWaitCode);
  Request back;
  Decoded d = decode_request(bytes, Dialect::kModern, StoreLimits{}, back);
  EXPECT_EQ(d.consumed, bytes.size());
  EXPECT_EQ(back.op, Op::kAddWait);
  EXPECT_EQ(back.keys, req.keys);
  EXPECT_EQ(back.delta, 1);
  EXPECT_EQ(back.target, 64);
  // Every shorter prefix is incomplete.
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(
        decode_request(
            std::string_view(bytes).substr(0, n),
            Dialect::kModern,
            StoreLimits{},
            back)
            .consumed,
        0u);
  }
  std::string reply;
  encode_reply({.number = 7, .values = {"commit 3"}}, Op::kAddWait, reply);
  Reply r;
  EXPECT_EQ(decode_reply(reply.substr(0, reply.size() - 1), req, r), 0u);
  EXPECT_EQ(decode_reply(reply, req, r), reply.size());
  EXPECT_EQ(r.number, 7);
  EXPECT_EQ(r.values, std::vector<std::string>{"commit 3"});
}

}  // namespace
}  // namespace tide::store::wire
