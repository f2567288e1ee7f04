#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tide/rpc/stream.h"

// How each type tide serializes travels (docs/rpc-serialization.md): a
// Codec<T> for bool, the integers and floats, strings, vectors (of numbers:
// packed), maps, tuples and pairs, optionals, and user types with
// serialize/deserialize members; the conversions a decoder allows. The API
// is tide/rpc/serialize.h.
namespace tide::rpc {

namespace detail {

template <typename T>
constexpr bool kNoCodec = false;

template <typename T>
concept Integer =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) <= 8;

template <typename T>
concept Float = std::is_same_v<T, float> || std::is_same_v<T, double>;

// Vectors of these travel as packed arrays.
template <typename T>
concept Number = Integer<T> || Float<T>;

template <typename T>
concept UserType = requires(const T& v, Encoder& e, Decoder& d) {
  v.serialize(e);
  { T::deserialize(d) } -> std::same_as<T>;
};

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <Number T>
constexpr Tag scalar_tag() {
  if constexpr (std::is_same_v<T, float>) {
    return Tag::kF32;
  } else if constexpr (std::is_same_v<T, double>) {
    return Tag::kF64;
  } else if constexpr (std::is_signed_v<T>) {
    constexpr std::array<Tag, 4> kTags = {
        Tag::kI8, Tag::kI16, Tag::kI32, Tag::kI64};
    return kTags[std::countr_zero(sizeof(T))];
  } else {
    constexpr std::array<Tag, 4> kTags = {
        Tag::kU8, Tag::kU16, Tag::kU32, Tag::kU64};
    return kTags[std::countr_zero(sizeof(T))];
  }
}

// The compiler's spelling of T, cut from __PRETTY_FUNCTION__: GCC writes
// "... [with T = ns::Point; ...]", Clang "... [T = ns::Point]".
template <typename T>
constexpr std::string_view type_name() {
  std::string_view f = __PRETTY_FUNCTION__;
  size_t begin = f.find("T = ") + 4;
  return f.substr(begin, f.find_first_of(";]", begin) - begin);
}

template <typename T>
constexpr void check_codec() {
  static_assert(
      !requires { Codec<T>::kMissing; },
      "tide::rpc cannot serialize this type; give it members "
      "void serialize(tide::rpc::Encoder&) const and "
      "static T deserialize(tide::rpc::Decoder&) (see serialize.h)");
}

template <typename T>
void write(Encoder& e, const T& v) {
  check_codec<std::remove_cv_t<T>>();
  Codec<std::remove_cv_t<T>>::write(e, v);
}

template <typename T>
T read(Decoder& d) {
  static_assert(
      std::is_same_v<T, std::remove_cvref_t<T>>,
      "tide::rpc decodes values: ask for T, not const T or T&");
  if constexpr (!IsOptional<T>::value) {
    // An engaged optional decodes as its value.
    while (d.peek_tag() == Tag::kSome) {
      d.read_tag();
    }
  }
  check_codec<T>();
  return Codec<T>::read(d);
}

// An integer off the wire: its bits, and whether a signed tag made it
// negative.
struct WireInt {
  uint64_t bits = 0;
  bool negative = false;

  std::string str() const {
    return negative ? std::to_string(static_cast<int64_t>(bits))
                    : std::to_string(bits);
  }
};

inline WireInt signed_int(int64_t v) {
  return {static_cast<uint64_t>(v), v < 0};
}

// Reads the value of integer tag t; false (reading nothing) for other tags.
inline bool read_wire_int(Decoder& d, Tag t, WireInt& v) {
  switch (t) {
    case Tag::kI8:
      v = signed_int(d.read_fixed<int8_t>());
      return true;
    case Tag::kI16:
      v = signed_int(d.read_fixed<int16_t>());
      return true;
    case Tag::kI32:
      v = signed_int(d.read_fixed<int32_t>());
      return true;
    case Tag::kI64:
      v = signed_int(d.read_fixed<int64_t>());
      return true;
    case Tag::kU8:
      v = {d.read_fixed<uint8_t>(), false};
      return true;
    case Tag::kU16:
      v = {d.read_fixed<uint16_t>(), false};
      return true;
    case Tag::kU32:
      v = {d.read_fixed<uint32_t>(), false};
      return true;
    case Tag::kU64:
      v = {d.read_fixed<uint64_t>(), false};
      return true;
    default:
      return false;
  }
}

template <Integer T>
bool fits(WireInt v) {
  using Limits = std::numeric_limits<T>;
  if (v.negative) {
    return std::is_signed_v<T> &&
           static_cast<int64_t>(v.bits) >= static_cast<int64_t>(Limits::min());
  }
  return v.bits <= static_cast<uint64_t>(Limits::max());
}

// The value of scalar tag t (already read) as T, under the widening rules.
template <Number T>
T read_number(Decoder& d, Tag t) {
  constexpr std::string_view kWant = tag_name(scalar_tag<T>());
  if constexpr (Float<T>) {
    if (t == Tag::kF32) {
      return d.read_fixed<float>();
    }
    if (t == Tag::kF64) {
      auto v = d.read_fixed<double>();
      if constexpr (std::is_same_v<T, float>) {
        constexpr double kMax = std::numeric_limits<float>::max();
        constexpr double kInf = std::numeric_limits<double>::infinity();
        if ((v > kMax && v != kInf) || (v < -kMax && v != -kInf)) {
          d.fail(
              "expected f32, got f64 " + format_double(v) + " (out of range)");
        }
      }
      return static_cast<T>(v);
    }
  }
  WireInt v;
  if (!read_wire_int(d, t, v)) {
    d.mismatch(kWant, t);
  }
  if constexpr (Float<T>) {
    constexpr uint64_t kExact = uint64_t{1} << std::numeric_limits<T>::digits;
    uint64_t magnitude = v.negative ? 0 - v.bits : v.bits;
    if (magnitude > kExact) {
      d.fail(
          "expected " + std::string(kWant) + ", got " +
          std::string(tag_name(t)) + " " + v.str() + " (not exact in " +
          std::string(kWant) + ")");
    }
    return v.negative ? static_cast<T>(static_cast<int64_t>(v.bits))
                      : static_cast<T>(v.bits);
  } else {
    if (!fits<T>(v)) {
      d.fail(
          "expected " + std::string(kWant) + ", got " +
          std::string(tag_name(t)) + " " + v.str() + " (out of range)");
    }
    return v.negative ? static_cast<T>(static_cast<int64_t>(v.bits))
                      : static_cast<T>(v.bits);
  }
}

// Elements to reserve for a list of n: all of them up to 1 MiB, so a
// count that the input cannot back costs no more than that.
template <typename T>
size_t reserve_hint(uint64_t n) {
  constexpr uint64_t kMax = (uint64_t{1} << 20) / sizeof(T);
  return static_cast<size_t>(n < kMax ? n : kMax);
}

template <typename Tuple, typename... Ts, size_t... I>
Tuple read_items(Decoder& d, Decoder::Step step, std::index_sequence<I...>) {
  Decoder::Nest nest(d, step);
  // Braces evaluate left to right.
  return Tuple{(nest.at(I), read<Ts>(d))...};
}

template <typename Tuple>
void write_items(Encoder& e, const Tuple& t) {
  e.write_tag(Tag::kTuple);
  e.write_varint(std::tuple_size_v<Tuple>);
  Encoder::Nest nest(e);
  std::apply([&e](const auto&... v) { (write(e, v), ...); }, t);
}

// Reads a kTuple header of N items.
inline void read_tuple_header(Decoder& d, uint64_t n) {
  Tag t = d.read_tag();
  if (t != Tag::kTuple) {
    d.mismatch("tuple of " + std::to_string(n), t);
  }
  uint64_t got = d.read_varint();
  if (got != n) {
    d.fail(
        "expected tuple of " + std::to_string(n) + ", got tuple of " +
        std::to_string(got));
  }
}

inline void write_string(Encoder& e, std::string_view s) {
  e.write_tag(Tag::kString);
  e.write_varint(s.size());
  e.write_raw(s.data(), s.size());
}

// std::map and std::unordered_map.
template <typename M>
struct MapCodec {
  static void write(Encoder& e, const M& m) {
    e.write_tag(Tag::kMap);
    e.write_varint(m.size());
    Encoder::Nest nest(e);
    for (const auto& [k, v] : m) {
      detail::write(e, k);
      detail::write(e, v);
    }
  }
  static M read(Decoder& d) {
    Tag t = d.read_tag();
    if (t != Tag::kMap) {
      d.mismatch("map", t);
    }
    uint64_t n = d.read_count("map", 2);
    M m;
    Decoder::Nest nest(d, Decoder::Step::kMapKey);
    for (uint64_t i = 0; i < n; ++i) {
      nest.at(Decoder::Step::kMapKey, i);
      auto k = detail::read<typename M::key_type>(d);
      nest.at(Decoder::Step::kMapValue, i);
      auto v = detail::read<typename M::mapped_type>(d);
      if (!m.try_emplace(std::move(k), std::move(v)).second) {
        nest.at(Decoder::Step::kMapKey, i);
        d.fail("duplicate key");
      }
    }
    return m;
  }
};

}  // namespace detail

// No codec: detail::write and detail::read refuse T at compile time, and
// Encodable<T> is false (an RRef may hold such a value on its owner; it
// cannot travel).
template <typename T>
struct Codec {
  static constexpr bool kMissing = true;
};

// Whether tide can serialize a T (a container of a type it cannot is a
// compile error where it is written or read).
template <typename T>
concept Encodable = !requires {
  Codec<std::remove_cvref_t<T>>::kMissing;
};

template <>
struct Codec<bool> {
  static void write(Encoder& e, bool v) {
    e.write_tag(Tag::kBool);
    e.write_fixed<uint8_t>(v ? 1 : 0);
  }
  static bool read(Decoder& d) {
    Tag t = d.read_tag();
    if (t != Tag::kBool) {
      d.mismatch("bool", t);
    }
    auto b = d.read_fixed<uint8_t>();
    if (b > 1) {
      d.fail("bool byte " + std::to_string(b) + " is neither 0 nor 1");
    }
    return b == 1;
  }
};

template <detail::Number T>
struct Codec<T> {
  static void write(Encoder& e, T v) {
    e.write_tag(detail::scalar_tag<T>());
    e.write_fixed(v);
  }
  static T read(Decoder& d) {
    return detail::read_number<T>(d, d.read_tag());
  }
};

template <>
struct Codec<std::string> {
  static void write(Encoder& e, const std::string& s) {
    detail::write_string(e, s);
  }
  static std::string read(Decoder& d) {
    Tag t = d.read_tag();
    if (t != Tag::kString) {
      d.mismatch("string", t);
    }
    return std::string(d.read_raw(d.read_count("string", 1)));
  }
};

// Views and C strings encode as strings and decode as std::string.
template <>
struct Codec<std::string_view> {
  static void write(Encoder& e, std::string_view s) {
    detail::write_string(e, s);
  }
  static std::string_view read(Decoder&) = delete;  // decode std::string
};

template <>
struct Codec<const char*> {
  static void write(Encoder& e, const char* s) {
    if (s == nullptr) {
      throw InvalidArgument("cannot encode a null C string");
    }
    detail::write_string(e, s);
  }
  static const char* read(Decoder&) = delete;  // decode std::string
};

template <>
struct Codec<char*> : Codec<const char*> {};

// A char array holds a string up to its first NUL ("literals").
template <size_t N>
struct Codec<char[N]> {
  static void write(Encoder& e, const char (&s)[N]) {
    std::string_view v(s, N);
    detail::write_string(e, v.substr(0, v.find('\0')));
  }
};

template <typename T, typename A>
struct Codec<std::vector<T, A>> {
  static void write(Encoder& e, const std::vector<T, A>& v) {
    if constexpr (detail::Number<T>) {
      e.write_tag(Tag::kArray);
      e.write_tag(detail::scalar_tag<T>());
      e.write_varint(v.size());
      Encoder::Nest nest(e);
      e.write_raw(v.data(), v.size() * sizeof(T));
    } else {
      e.write_tag(Tag::kList);
      e.write_varint(v.size());
      Encoder::Nest nest(e);
      for (const auto& x : v) {
        detail::write<T>(e, x);
      }
    }
  }

  static std::vector<T, A> read(Decoder& d) {
    Tag t = d.read_tag();
    std::vector<T, A> v;
    if constexpr (detail::Number<T>) {
      if (t == Tag::kArray) {
        read_array(d, v);
        return v;
      }
    }
    if (t != Tag::kList) {
      d.mismatch("list", t);
    }
    uint64_t n = d.read_count("list", 1);
    v.reserve(detail::reserve_hint<T>(n));
    Decoder::Nest nest(d, Decoder::Step::kElement);
    for (uint64_t i = 0; i < n; ++i) {
      nest.at(i);
      v.push_back(detail::read<T>(d));
    }
    return v;
  }

 private:
  static void read_array(Decoder& d, std::vector<T, A>& v) {
    Tag element = d.read_tag();
    size_t width = detail::scalar_width(element);
    if (width == 0) {
      d.fail(
          "array of type tag " + std::to_string(static_cast<int>(element)) +
          ", which is not a number type");
    }
    uint64_t n = d.read_count("array", width);
    Decoder::Nest nest(d, Decoder::Step::kElement);
    if (element == detail::scalar_tag<T>()) {
      v.resize(n);
      std::string_view bytes = d.read_raw(n * sizeof(T));
      if (n > 0) {
        std::memcpy(v.data(), bytes.data(), bytes.size());
      }
      return;
    }
    v.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      nest.at(i);
      v.push_back(detail::read_number<T>(d, element));
    }
  }
};

template <typename K, typename V, typename C, typename A>
struct Codec<std::map<K, V, C, A>> : detail::MapCodec<std::map<K, V, C, A>> {};

template <typename K, typename V, typename H, typename E, typename A>
struct Codec<std::unordered_map<K, V, H, E, A>>
    : detail::MapCodec<std::unordered_map<K, V, H, E, A>> {};

template <typename... Ts>
struct Codec<std::tuple<Ts...>> {
  static void write(Encoder& e, const std::tuple<Ts...>& t) {
    detail::write_items(e, t);
  }
  static std::tuple<Ts...> read(Decoder& d) {
    detail::read_tuple_header(d, sizeof...(Ts));
    return detail::read_items<std::tuple<Ts...>, Ts...>(
        d, Decoder::Step::kTupleItem, std::index_sequence_for<Ts...>{});
  }
};

template <typename A, typename B>
struct Codec<std::pair<A, B>> {
  static void write(Encoder& e, const std::pair<A, B>& p) {
    detail::write_items(e, p);
  }
  static std::pair<A, B> read(Decoder& d) {
    detail::read_tuple_header(d, 2);
    return detail::read_items<std::pair<A, B>, A, B>(
        d, Decoder::Step::kTupleItem, std::index_sequence_for<A, B>{});
  }
};

template <typename T>
struct Codec<std::optional<T>> {
  static void write(Encoder& e, const std::optional<T>& v) {
    if (!v) {
      e.write_tag(Tag::kNone);
      return;
    }
    e.write_tag(Tag::kSome);
    detail::write<T>(e, *v);
  }
  static std::optional<T> read(Decoder& d) {
    Tag t = d.peek_tag();
    if (t == Tag::kNone || t == Tag::kSome) {
      d.read_tag();
    }
    if (t == Tag::kNone) {
      return std::nullopt;
    }
    return detail::read<T>(d);
  }
};

template <>
struct Codec<std::nullopt_t> {
  static void write(Encoder& e, std::nullopt_t) {
    e.write_tag(Tag::kNone);
  }
};

template <detail::UserType T>
struct Codec<T> {
  static constexpr std::string_view kName = detail::type_name<T>();

  static void write(Encoder& e, const T& v) {
    e.write_tag(Tag::kStruct);
    {
      Encoder::Nest nest(e);
      v.serialize(e);
    }
    e.write_tag(Tag::kEnd);
  }
  static T read(Decoder& d) {
    Tag t = d.read_tag();
    if (t != Tag::kStruct) {
      d.mismatch(kName, t);
    }
    Decoder::Nest nest(d, Decoder::Step::kField, kName);
    T v = T::deserialize(d);
    if (d.peek_tag() != Tag::kEnd) {
      uint64_t fields = nest.index();
      nest.at(0);
      d.fail(
          "the sender wrote more than the " + std::to_string(fields) +
          " fields deserialize() reads");
    }
    d.read_tag();
    return v;
  }
};

}  // namespace tide::rpc
