#include "tide/rpc/serialize.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"

// User types live in a named namespace: their names appear in messages.
namespace rpc_test {

using tide::rpc::Decoder;
using tide::rpc::Encoder;

struct Point {
  double x = 0;
  double y = 0;
  std::string label;

  void serialize(Encoder& e) const {
    encode(e, x);
    encode(e, y);
    encode(e, label);
  }
  static Point deserialize(Decoder& d) {
    return {decode<double>(d), decode<double>(d), decode<std::string>(d)};
  }
  bool operator==(const Point&) const = default;
};

// An older Point, without the label.
struct FlatPoint {
  double x = 0;
  double y = 0;

  void serialize(Encoder& e) const {
    encode(e, x);
    encode(e, y);
  }
  static FlatPoint deserialize(Decoder& d) {
    FlatPoint p;
    p.x = decode<double>(d);
    p.y = decode<double>(d);
    return p;
  }
};

// Recursive, so its nesting depth comes from the data.
struct Node {
  std::vector<Node> children;

  void serialize(Encoder& e) const {
    encode(e, children);
  }
  static Node deserialize(Decoder& d) {
    return {decode<std::vector<Node>>(d)};
  }
};

}  // namespace rpc_test

namespace tide::rpc {
namespace {

using rpc_test::FlatPoint;
using rpc_test::Node;
using rpc_test::Point;

template <typename T>
std::string bytes_of(const T& v) {
  std::string out;
  Encoder e(out);
  encode(e, v);
  return out;
}

template <typename T>
T decode_all(std::string_view bytes) {
  Decoder d(bytes);
  T v = decode<T>(d);
  d.finish();
  return v;
}

template <typename T>
T round_trip(const T& v) {
  return decode_all<T>(bytes_of(v));
}

// The message of the InvalidArgument that decoding `bytes` as T throws.
template <typename T>
std::string decode_error(std::string_view bytes) {
  try {
    decode_all<T>(bytes);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "decoded without an error";
  return {};
}

template <typename Tuple>
std::string args_error(std::string_view bytes, std::string_view function) {
  try {
    Decoder d(bytes);
    decode_args<Tuple>(d, function);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "decoded without an error";
  return {};
}

template <typename... Args>
std::string args_of(const Args&... args) {
  std::string out;
  Encoder e(out);
  encode_args(e, args...);
  return out;
}

// A chain of n nodes, each the only child of the one before.
Node chain(int n) {
  Node root;
  Node* last = &root;
  for (int i = 1; i < n; ++i) {
    last->children.resize(1);
    last = &last->children[0];
  }
  return root;
}

// The bytes of chain(n), built by hand: the encoder refuses deep ones.
std::string chain_bytes(int n) {
  std::string out;
  Encoder e(out);
  for (int i = 0; i < n; ++i) {
    e.write_tag(Tag::kStruct);
    e.write_tag(Tag::kList);
    e.write_varint(i + 1 < n ? 1 : 0);
  }
  for (int i = 0; i < n; ++i) {
    e.write_tag(Tag::kEnd);
  }
  return out;
}

using Complex = std::map<
    std::string,
    std::vector<
        std::tuple<Point, std::optional<double>, std::vector<uint8_t>>>>;

Complex complex_value() {
  return {
      {"first",
       {{Point{1.5, -2, "a"}, 3.25, {1, 2, 3}},
        {Point{0, 0, ""}, std::nullopt, {}}}},
      {"second", {{Point{7, 8, "label"}, -0.5, {255}}}},
      {"", {}},
  };
}

TEST(SerializeTest, RoundTripsEveryScalarType) {
  EXPECT_EQ(round_trip(true), true);
  EXPECT_EQ(round_trip(false), false);
  EXPECT_EQ(round_trip('x'), 'x');
  EXPECT_EQ(round_trip(std::numeric_limits<int8_t>::min()), INT8_MIN);
  EXPECT_EQ(round_trip(int16_t{-12345}), -12345);
  EXPECT_EQ(round_trip(std::numeric_limits<int32_t>::max()), INT32_MAX);
  EXPECT_EQ(round_trip(std::numeric_limits<int64_t>::min()), INT64_MIN);
  EXPECT_EQ(round_trip(uint8_t{255}), 255);
  EXPECT_EQ(round_trip(uint16_t{65535}), 65535);
  EXPECT_EQ(round_trip(uint32_t{4000000000}), 4000000000u);
  EXPECT_EQ(round_trip(std::numeric_limits<uint64_t>::max()), UINT64_MAX);
  EXPECT_EQ(round_trip(1.25f), 1.25f);
  EXPECT_EQ(round_trip(-1e300), -1e300);
  EXPECT_TRUE(std::signbit(round_trip(-0.0)));
  EXPECT_EQ(
      round_trip(std::numeric_limits<double>::infinity()),
      std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(round_trip(std::nan(""))));
}

TEST(SerializeTest, EncodesTheDocumentedBytes) {
  EXPECT_EQ(bytes_of(int32_t{0x01020304}), std::string("\x04\x04\x03\x02\x01"));
  EXPECT_EQ(bytes_of(true), std::string("\x01\x01"));
  EXPECT_EQ(bytes_of(std::string("hi")), std::string("\x0c\x02hi"));
  // A tuple of two: tag, count, the values.
  EXPECT_EQ(
      args_of(2, "x"), std::string("\x10\x02\x04\x02\0\0\0\x0c\x01x", 10));
}

TEST(SerializeTest, RoundTripsStringsAndEncodesViewsAndCStringsAsStrings) {
  EXPECT_EQ(round_trip(std::string()), "");
  EXPECT_EQ(round_trip(std::string("a\0b", 3)), std::string("a\0b", 3));
  std::string long_string(100000, 'z');
  EXPECT_EQ(round_trip(long_string), long_string);

  EXPECT_EQ(
      decode_all<std::string>(bytes_of(std::string_view("view"))), "view");
  const char* c_string = "c string";
  EXPECT_EQ(decode_all<std::string>(bytes_of(c_string)), "c string");
  EXPECT_EQ(decode_all<std::string>(bytes_of("literal")), "literal");
  const char* null_string = nullptr;
  EXPECT_THROW(bytes_of(null_string), InvalidArgument);
}

TEST(SerializeTest, RoundTripsContainers) {
  EXPECT_EQ(
      round_trip(std::vector<int>{1, -2, 3}), (std::vector<int>{1, -2, 3}));
  EXPECT_EQ(
      round_trip(std::vector<double>{0.5, -1}), (std::vector<double>{0.5, -1}));
  EXPECT_EQ(round_trip(std::vector<int>{}), std::vector<int>{});
  EXPECT_EQ(
      round_trip(std::vector<bool>{true, false, true}),
      (std::vector<bool>{true, false, true}));
  EXPECT_EQ(
      round_trip(std::vector<std::string>{"a", "", "c"}),
      (std::vector<std::string>{"a", "", "c"}));
  std::map<std::string, int> map = {{"one", 1}, {"two", 2}};
  EXPECT_EQ(round_trip(map), map);
  std::unordered_map<int, std::vector<std::string>> umap = {
      {1, {"x"}}, {-7, {}}};
  EXPECT_EQ(round_trip(umap), umap);
  auto tuple = std::make_tuple(1, std::string("s"), 2.5, false);
  EXPECT_EQ(round_trip(tuple), tuple);
  EXPECT_EQ(round_trip(std::tuple<>()), std::tuple<>());
  auto pair = std::make_pair(std::string("k"), uint64_t{9});
  EXPECT_EQ(round_trip(pair), pair);
  EXPECT_EQ(round_trip(std::optional<int>()), std::nullopt);
  EXPECT_EQ(round_trip(std::optional<int>(4)), 4);
  // An engaged optional holding an empty one stays distinct from empty.
  std::optional<std::optional<int>> some_none(std::in_place, std::nullopt);
  EXPECT_EQ(round_trip(some_none), some_none);
  EXPECT_EQ(round_trip(std::optional<std::optional<int>>()), std::nullopt);
}

TEST(SerializeTest, RoundTripsNestedContainersAndUserTypes) {
  Point p{1.5, -2.25, "corner"};
  EXPECT_EQ(round_trip(p), p);
  EXPECT_EQ(round_trip(complex_value()), complex_value());

  std::vector<std::tuple<Point, std::map<int, std::string>>> nested = {
      {Point{1, 2, "a"}, {{1, "one"}}}, {Point{}, {}}};
  EXPECT_EQ(round_trip(nested), nested);

  Node tree;
  tree.children.resize(3);
  tree.children[1].children.resize(2);
  Node back = round_trip(tree);
  ASSERT_EQ(back.children.size(), 3u);
  EXPECT_EQ(back.children[1].children.size(), 2u);
}

TEST(SerializeTest, MapsAndUnorderedMapsShareTheirEncoding) {
  std::map<std::string, int> ordered = {{"a", 1}, {"b", 2}};
  auto unordered =
      decode_all<std::unordered_map<std::string, int>>(bytes_of(ordered));
  EXPECT_EQ(
      unordered, (std::unordered_map<std::string, int>{{"a", 1}, {"b", 2}}));
  EXPECT_EQ(
      (decode_all<std::map<std::string, int>>(bytes_of(unordered))), ordered);
}

TEST(SerializeTest, VectorsOfNumbersArePacked) {
  // Tag, element tag, count, then the scalars.
  EXPECT_EQ(bytes_of(std::vector<int32_t>{1, 2, 3}).size(), 3 + 12u);
  EXPECT_EQ(bytes_of(std::vector<uint8_t>(1000, 7)).size(), 4 + 1000u);
  // A list of numbers decodes as a vector too.
  EXPECT_EQ(
      decode_all<std::vector<int>>(
          bytes_of(std::vector<std::optional<int>>{1, 2})),
      (std::vector<int>{1, 2}));
}

TEST(SerializeTest, PackedArraysConvertElementByElement) {
  EXPECT_EQ(
      decode_all<std::vector<int64_t>>(bytes_of(std::vector<int8_t>{-1, 2})),
      (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(
      decode_all<std::vector<double>>(bytes_of(std::vector<int>{3, 4})),
      (std::vector<double>{3, 4}));
  EXPECT_EQ(
      decode_error<std::vector<int32_t>>(
          bytes_of(std::vector<int64_t>{1, 5'000'000'000})),
      "[1]: expected i32, got i64 5000000000 (out of range)");
  EXPECT_EQ(
      decode_error<std::vector<int>>(bytes_of(std::vector<double>{1})),
      "[0]: expected i32, got f64");
}

TEST(SerializeTest, IntegersDecodeAsAnyIntegerTypeTheirValueFits) {
  EXPECT_EQ(decode_all<int64_t>(bytes_of(int32_t{-5})), -5);
  EXPECT_EQ(decode_all<int32_t>(bytes_of(int64_t{-5})), -5);
  EXPECT_EQ(decode_all<int8_t>(bytes_of(uint64_t{127})), 127);
  EXPECT_EQ(decode_all<uint16_t>(bytes_of(int64_t{65535})), 65535);
  EXPECT_EQ(
      decode_all<uint64_t>(bytes_of(int64_t{INT64_MAX})), uint64_t{INT64_MAX});

  EXPECT_EQ(
      decode_error<int32_t>(bytes_of(int64_t{5'000'000'000})),
      "expected i32, got i64 5000000000 (out of range)");
  EXPECT_EQ(
      decode_error<uint32_t>(bytes_of(-1)),
      "expected u32, got i32 -1 (out of range)");
  EXPECT_EQ(
      decode_error<int64_t>(bytes_of(UINT64_MAX)),
      "expected i64, got u64 18446744073709551615 (out of range)");
  EXPECT_EQ(
      decode_error<int8_t>(bytes_of(uint8_t{128})),
      "expected i8, got u8 128 (out of range)");
  EXPECT_EQ(
      decode_error<int16_t>(bytes_of(INT64_MIN)),
      "expected i16, got i64 -9223372036854775808 (out of range)");
}

TEST(SerializeTest, IntegersDecodeAsFloatingPointWhenExact) {
  EXPECT_EQ(decode_all<double>(bytes_of(7)), 7.0);
  EXPECT_EQ(decode_all<double>(bytes_of(int64_t{1} << 53)), 9007199254740992.0);
  EXPECT_EQ(decode_all<float>(bytes_of(-(1 << 24))), -16777216.0f);
  EXPECT_EQ(
      decode_error<double>(bytes_of((int64_t{1} << 53) + 1)),
      "expected f64, got i64 9007199254740993 (not exact in f64)");
  EXPECT_EQ(
      decode_error<float>(bytes_of((1 << 24) + 1)),
      "expected f32, got i32 16777217 (not exact in f32)");
}

TEST(SerializeTest, FloatsWidenAndNarrowWithinRange) {
  EXPECT_EQ(decode_all<double>(bytes_of(0.5f)), 0.5);
  EXPECT_EQ(decode_all<float>(bytes_of(0.1)), 0.1f);
  EXPECT_EQ(
      decode_all<float>(bytes_of(-std::numeric_limits<double>::infinity())),
      -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(decode_all<float>(bytes_of(std::nan("")))));
  EXPECT_EQ(
      decode_error<float>(bytes_of(1e300)),
      "expected f32, got f64 1.0000000000000001e+300 (out of range)");
}

TEST(SerializeTest, NumbersNeverChangeKind) {
  EXPECT_EQ(decode_error<int>(bytes_of(1.0)), "expected i32, got f64");
  EXPECT_EQ(decode_error<uint8_t>(bytes_of(1.0f)), "expected u8, got f32");
  EXPECT_EQ(decode_error<int>(bytes_of(true)), "expected i32, got bool");
  EXPECT_EQ(decode_error<bool>(bytes_of(1)), "expected bool, got i32");
  EXPECT_EQ(decode_error<double>(bytes_of(false)), "expected f64, got bool");
}

TEST(SerializeTest, OptionalsConvertToAndFromTheirValue) {
  EXPECT_EQ(decode_all<std::optional<int>>(bytes_of(3)), 3);
  EXPECT_EQ(decode_all<int>(bytes_of(std::optional<int>(3))), 3);
  EXPECT_EQ(
      decode_all<std::optional<std::string>>(bytes_of(std::nullopt)),
      std::nullopt);
  EXPECT_EQ(
      decode_error<int>(bytes_of(std::optional<int>())),
      "expected i32, got none");
  EXPECT_EQ(
      decode_error<std::vector<int>>(
          bytes_of(std::vector<std::optional<int>>{1, std::nullopt})),
      "[1]: expected i32, got none");
}

TEST(SerializeTest, MismatchesNameWhatWasExpectedAndWhatCame) {
  std::string s = bytes_of(std::string("text"));
  EXPECT_EQ(
      decode_error<std::vector<std::string>>(s), "expected list, got string");
  EXPECT_EQ((decode_error<std::map<int, int>>(s)), "expected map, got string");
  EXPECT_EQ(
      (decode_error<std::tuple<int, int>>(s)),
      "expected tuple of 2, got string");
  EXPECT_EQ(decode_error<Point>(s), "expected rpc_test::Point, got string");
  EXPECT_EQ(
      decode_error<std::string>(bytes_of(std::vector<std::string>{})),
      "expected string, got list");
  EXPECT_EQ(
      decode_error<std::vector<std::string>>(bytes_of(std::vector<int>{1})),
      "expected list, got array of i32");
  EXPECT_EQ(
      decode_error<std::string>(bytes_of(Point{})),
      "expected string, got struct");
  EXPECT_EQ(
      (decode_error<std::pair<int, int>>(bytes_of(std::make_tuple(1, 2, 3)))),
      "expected tuple of 2, got tuple of 3");
}

TEST(SerializeTest, ErrorsNameThePathToTheValue) {
  std::map<std::string, std::vector<int>> m = {{"k", {1, 2}}};
  EXPECT_EQ(
      (decode_error<std::map<std::string, std::vector<std::string>>>(
          bytes_of(m))),
      "map entry 0 value: expected list, got array of i32");
  EXPECT_EQ(
      (decode_error<std::map<int, std::vector<int>>>(bytes_of(m))),
      "map entry 0 key: expected i32, got string");
  std::vector<std::vector<std::string>> lists = {{}, {"a", "b", "c"}};
  EXPECT_EQ(
      decode_error<std::vector<std::vector<int>>>(bytes_of(lists)),
      "[1]: [0]: expected i32, got string");
  EXPECT_EQ(
      (decode_error<std::tuple<int, int>>(bytes_of(std::make_tuple(1, "x")))),
      "tuple item 1: expected i32, got string");
  std::vector<Point> points = {Point{}, Point{1, 2, "p"}};
  EXPECT_EQ(
      decode_error<std::vector<std::tuple<Point>>>(bytes_of(points)),
      "[0]: expected tuple of 1, got struct");
}

TEST(SerializeTest, UserTypesCheckTheirFields) {
  std::string flat = bytes_of(FlatPoint{1, 2});
  EXPECT_EQ(
      decode_error<Point>(flat),
      "rpc_test::Point field 3: not sent; the sender wrote 2 fields");
  EXPECT_EQ(
      decode_error<FlatPoint>(bytes_of(Point{1, 2, "p"})),
      "rpc_test::FlatPoint: the sender wrote more than the 2 fields "
      "deserialize() reads");

  std::string wrong_field;
  Encoder e(wrong_field);
  e.write_tag(Tag::kStruct);
  encode(e, 1.0);
  encode(e, std::string("not y"));
  e.write_tag(Tag::kEnd);
  EXPECT_EQ(
      decode_error<FlatPoint>(wrong_field),
      "rpc_test::FlatPoint field 2: expected f64, got string");
}

TEST(SerializeTest, DecodeArgsReadsAnArgumentPack) {
  std::string bytes = args_of(2, "three", std::vector<double>{4});
  Decoder d(bytes);
  auto [a, b, c] =
      decode_args<std::tuple<int64_t, const std::string&, std::vector<double>>>(
          d, "f");
  d.finish();
  EXPECT_EQ(a, 2);
  EXPECT_EQ(b, "three");
  EXPECT_EQ(c, std::vector<double>{4});

  std::string none = args_of();
  Decoder empty(none);
  EXPECT_EQ(decode_args<std::tuple<>>(empty, "ping"), std::tuple<>());
}

TEST(SerializeTest, DecodeArgsNamesTheFunctionAndArgument) {
  EXPECT_EQ(
      (args_error<std::tuple<double, double>>(args_of(1.0, "x"), "add")),
      "add(): argument 2: expected f64, got string");
  EXPECT_EQ(
      (args_error<std::tuple<std::vector<int>>>(
          args_of(std::vector<std::string>{"a"}), "sum")),
      "sum(): argument 1: [0]: expected i32, got string");
  EXPECT_EQ(
      (args_error<std::tuple<int, Point>>(args_of(1, FlatPoint{}), "draw")),
      "draw(): argument 2: rpc_test::Point field 3: not sent; the sender "
      "wrote 2 fields");
  EXPECT_EQ(
      (args_error<std::tuple<int>>(bytes_of(1), "neg")),
      "neg(): expected an argument tuple, got i32");
}

TEST(SerializeTest, DecodeArgsChecksTheArgumentCount) {
  EXPECT_EQ(
      (args_error<std::tuple<int, int>>(args_of(1, 2, 3), "add")),
      "add() takes 2 arguments, got 3");
  EXPECT_EQ(
      (args_error<std::tuple<int>>(args_of(1, 2), "neg")),
      "neg() takes 1 argument, got 2");
  EXPECT_EQ(
      (args_error<std::tuple<>>(args_of(1), "ping")),
      "ping() takes 0 arguments, got 1");
}

TEST(SerializeTest, DecodeResultNamesTheFunction) {
  std::string bytes = bytes_of(std::string("five"));
  Decoder d(bytes);
  try {
    decode_result<int64_t>(d, "add");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "add(): result: expected i64, got string");
  }
  std::string good = bytes_of(5);
  Decoder ok(good);
  EXPECT_EQ(decode_result<int64_t>(ok, "add"), 5);
}

TEST(SerializeTest, EveryTruncationOfAComplexValueThrows) {
  std::string bytes = bytes_of(complex_value());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THROW(decode_all<Complex>(bytes.substr(0, n)), InvalidArgument)
        << "prefix of " << n << " bytes";
  }
  EXPECT_EQ(decode_error<Complex>(bytes + "x"), "1 byte left after the value");
  EXPECT_EQ(
      decode_error<int>(""),
      "truncated input: 1 more bytes needed at offset 0, 0 left");
  EXPECT_EQ(
      decode_error<std::vector<int>>(
          bytes_of(std::vector<int>{1, 2}).substr(0, 10)),
      "array of length 2 cannot fit in the 7 bytes left");
}

TEST(SerializeTest, CorruptedBytesThrowOrDecodeButNeverCrash) {
  std::string bytes = bytes_of(complex_value());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t flip : {0x01, 0x02, 0x10, 0x7F, 0x80, 0xFF}) {
      std::string corrupt = bytes;
      corrupt[i] = static_cast<char>(corrupt[i] ^ flip);
      try {
        decode_all<Complex>(corrupt);
      } catch (const InvalidArgument&) {
      }
    }
  }
}

TEST(SerializeTest, AbsurdLengthsFailBeforeAllocating) {
  auto claim = [](Tag tag, uint64_t n) {
    std::string out;
    Encoder e(out);
    e.write_tag(tag);
    if (tag == Tag::kArray) {
      e.write_tag(Tag::kI64);
    }
    e.write_varint(n);
    e.write_raw("abcd", 4);
    return out;
  };
  uint64_t huge = uint64_t{1} << 60;
  EXPECT_EQ(
      decode_error<std::vector<std::string>>(claim(Tag::kList, huge)),
      "list of length 1152921504606846976 cannot fit in the 4 bytes left");
  EXPECT_EQ(
      decode_error<std::vector<int64_t>>(claim(Tag::kArray, huge)),
      "array of length 1152921504606846976 cannot fit in the 4 bytes left");
  EXPECT_EQ(
      decode_error<std::string>(claim(Tag::kString, huge)),
      "string of length 1152921504606846976 cannot fit in the 4 bytes left");
  EXPECT_EQ(
      (decode_error<std::map<int, int>>(claim(Tag::kMap, 3))),
      "map of length 3 cannot fit in the 4 bytes left");
  EXPECT_EQ(
      decode_error<std::vector<int>>(claim(Tag::kList, UINT64_MAX)),
      "list of length 18446744073709551615 cannot fit in the 4 bytes left");

  std::string overlong(1, static_cast<char>(Tag::kString));
  overlong += std::string(10, '\xFF');
  overlong += '\x01';
  EXPECT_EQ(
      decode_error<std::string>(overlong), "varint does not fit in 64 bits");
}

TEST(SerializeTest, NestingIsLimitedOnBothSides) {
  // Each node is two levels, its struct and its list of children.
  EXPECT_EQ(bytes_of(chain(kMaxDepth / 2)), chain_bytes(kMaxDepth / 2));
  EXPECT_NO_THROW(decode_all<Node>(chain_bytes(kMaxDepth / 2)));
  try {
    bytes_of(chain(kMaxDepth / 2 + 1));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(
        e.what(),
        "value nests more than 64 containers deep (lists, arrays, maps, "
        "tuples, structs); tide::rpc decodes no deeper");
  }

  std::string error = decode_error<Node>(chain_bytes(kMaxDepth / 2 + 1));
  EXPECT_EQ(
      error.find("rpc_test::Node field 1: [0]: rpc_test::Node field 1"), 0u)
      << error;
  EXPECT_TRUE(error.ends_with(": value nests more than 64 containers deep"))
      << error;
  EXPECT_THROW(decode_all<Node>(chain_bytes(100000)), InvalidArgument);
}

TEST(SerializeTest, MalformedScalarsAndTagsFail) {
  EXPECT_EQ(
      decode_error<int>("\x63"), "expected i32, got unknown type tag 0x63");
  EXPECT_EQ(
      decode_error<bool>(std::string("\x01\x02", 2)),
      "bool byte 2 is neither 0 nor 1");
  std::string strings_array = "\x0e\x0c\x01";
  EXPECT_EQ(
      decode_error<std::vector<int>>(strings_array),
      "array of type tag 12, which is not a number type");

  std::string duplicate;
  Encoder e(duplicate);
  e.write_tag(Tag::kMap);
  e.write_varint(2);
  for (int v : {1, 2}) {
    encode(e, std::string("a"));
    encode(e, v);
  }
  EXPECT_EQ(
      (decode_error<std::map<std::string, int>>(duplicate)),
      "map entry 1 key: duplicate key");
}

TEST(SerializeTest, OutOfBandBuffersTravelBesideTheStream) {
  std::string out;
  Encoder without(out);
  EXPECT_THROW(without.add_buffer("data"), InvalidArgument);

  std::vector<Buffer> buffers;
  Encoder e(out, &buffers);
  EXPECT_EQ(e.add_buffer("first"), 0u);
  EXPECT_EQ(e.add_buffer("second"), 1u);
  e.write_varint(1);

  Decoder d(out, buffers);
  EXPECT_EQ(d.buffer(d.read_varint()).view(), "second");
  try {
    d.buffer(5);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& err) {
    EXPECT_STREQ(
        err.what(), "buffer 5 does not exist; 2 came with the message");
  }
}

}  // namespace
}  // namespace tide::rpc
