#pragma once

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tide/rpc/codecs.h"
#include "tide/rpc/stream.h"

// The typed serialization of RPC arguments and results. Every value travels
// with a one-byte type tag, so the callee checks what came against the types
// it declared and says what differs:
//
//   std::string out;
//   Encoder e(out);
//   encode_args(e, 2, 3.5);                          // the caller
//
//   Decoder d(out);
//   auto [a, b] = decode_args<std::tuple<int64_t, double>>(d, "add");
//   // and with (int, std::string) instead:
//   //   InvalidArgument "add(): argument 2: expected string, got f64"
//
// Supported: bool; every integer type; float and double; std::string
// (std::string_view and C strings encode as strings); std::vector (of
// numbers: packed); std::map and std::unordered_map (the same on the wire,
// so one may be decoded as the other); std::tuple and std::pair;
// std::optional (std::nullopt encodes as an empty one); and user types with
// serialize/deserialize members (below). The byte format is in
// docs/rpc-serialization.md.
//
// Decoding converts by value, never by guess:
//   - An integer decodes as any integer type its value fits: i32 -> int64_t
//     always, i64 -> int32_t only when in range, -1 -> uint32_t never. It
//     decodes as float or double when exact (|v| <= 2^24 or 2^53).
//   - f32 -> double always; f64 -> float rounds, and fails outside float's
//     range. A floating point value never decodes as an integer, nor a bool
//     as a number or a number as a bool.
//   - A value decodes as std::optional<T> (engaged) when it decodes as T, and
//     an engaged optional decodes as T; an empty one only as an optional.
// Anything else throws InvalidArgument naming what was expected and what
// came, after the path to it: "add(): argument 1: [3]: expected i32, got
// string". Malformed input (truncated, lengths longer than the input, unknown
// tags, more than kMaxDepth nested containers) throws InvalidArgument too,
// before allocating for it: a length is checked against the bytes left, so
// what decoding allocates is bounded by the input's size times the size of
// the element types.
//
// User types: give the type both members below. serialize() encodes the
// fields in some order and deserialize() decodes them in the same order
// (C++ leaves the order of function arguments unspecified: decode into
// braces, which run left to right, or into separate statements).
//
//   struct Point {
//     double x = 0;
//     double y = 0;
//     std::string label;
//
//     void serialize(tide::rpc::Encoder& e) const {
//       encode(e, x);
//       encode(e, y);
//       encode(e, label);
//     }
//     static Point deserialize(tide::rpc::Decoder& d) {
//       return {decode<double>(d), decode<double>(d), decode<std::string>(d)};
//     }
//   };
//
// The fields are framed, so a reader that expects other fields fails naming
// the type and field ("Point field 3: expected string, got f64", "Point:
// the sender wrote more than the 2 fields deserialize() reads"). The type's
// name is not sent: a struct decodes as any struct whose fields match.
//
// Types tide supports itself get a Codec<T> specialisation instead
// (tide/rpc/codecs.h).
// at::Tensor has one in tide/rpc/tensor.h: its bytes leave the stream as an
// out-of-band Buffer (Encoder::add_buffer), and the stream holds its dtype,
// shape, strides and buffer index, so the transport sends tensors without
// copying them into the message.
//
// Encoders and decoders are not thread safe; use one per message.
namespace tide::rpc {

// Appends `value`.
template <typename T>
void encode(Encoder& e, const T& value) {
  detail::write(e, value);
}

// Reads a T.
template <typename T>
T decode(Decoder& d) {
  d.next_field();
  return detail::read<T>(d);
}

// Appends an argument pack: what decode_args reads.
template <typename... Args>
void encode_args(Encoder& e, const Args&... args) {
  e.write_tag(Tag::kTuple);
  e.write_varint(sizeof...(Args));
  Encoder::Nest nest(e);
  (detail::write(e, args), ...);
}

namespace detail {

template <typename Tuple>
struct Args;

template <typename... Ts>
struct Args<std::tuple<Ts...>> {
  using Decoded = std::tuple<std::remove_cvref_t<Ts>...>;

  static Decoded read(Decoder& d, std::string_view function) {
    Decoder::Nest call(d, Decoder::Step::kCall, function);
    Tag t = d.read_tag();
    if (t != Tag::kTuple) {
      d.mismatch("an argument tuple", t);
    }
    constexpr size_t kWant = sizeof...(Ts);
    uint64_t got = d.read_varint();
    if (got != kWant) {
      throw InvalidArgument(
          std::string(function) + "() takes " + std::to_string(kWant) +
          (kWant == 1 ? " argument" : " arguments") + ", got " +
          std::to_string(got));
    }
    return read_items<Decoded, std::remove_cvref_t<Ts>...>(
        d, Decoder::Step::kArgument, std::index_sequence_for<Ts...>{});
  }
};

}  // namespace detail

// Reads an argument pack of the types in Tuple (a std::tuple; references
// and const are dropped: std::tuple<const std::string&> reads a
// std::string). Errors name `function` and the argument, counted from 1:
// "add(): argument 2: expected f64, got string", "add() takes 2 arguments,
// got 3".
template <typename Tuple>
typename detail::Args<Tuple>::Decoded decode_args(
    Decoder& d, std::string_view function) {
  return detail::Args<Tuple>::read(d, function);
}

// Reads the result of `function`: "add(): result: expected i64, got string".
template <typename T>
T decode_result(Decoder& d, std::string_view function) {
  Decoder::Nest call(d, Decoder::Step::kCall, function);
  Decoder::Nest result(d, Decoder::Step::kResult);
  return detail::read<T>(d);
}

}  // namespace tide::rpc
