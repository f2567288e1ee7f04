#pragma once

#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tide/common/error.h"
#include "tide/rpc/buffer.h"

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
// Types tide supports itself get a Codec<T> specialisation instead (below).
// at::Tensor has one in tide/rpc/tensor.h: its bytes leave the stream as an
// out-of-band Buffer (Encoder::add_buffer), and the stream holds its dtype,
// shape, strides and buffer index, so the transport sends tensors without
// copying them into the message.
//
// Encoders and decoders are not thread safe; use one per message.
namespace tide::rpc {

static_assert(
    std::endian::native == std::endian::little,
    "tide::rpc writes scalars in host order; tide supports little-endian "
    "hosts");

// The most containers (lists, arrays, maps, tuples, structs; an argument
// pack counts as one) a value may nest. Both sides check it: the encoder so
// that the caller learns at once, the decoder so that input cannot recurse
// without bound.
constexpr int kMaxDepth = 64;

// The tag before every value. The numbers are the wire format: add new tags,
// never renumber.
enum class Tag : uint8_t {
  kBool = 1,  // one byte, 0 or 1
  kI8 = 2,    // kI8 .. kF64: the scalar, little-endian
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kU8 = 6,
  kU16 = 7,
  kU32 = 8,
  kU64 = 9,
  kF32 = 10,
  kF64 = 11,
  kString = 12,  // varint length, the bytes
  kList = 13,    // varint count, the values
  kArray = 14,   // element tag (kI8 .. kF64), varint count, packed scalars
  kMap = 15,     // varint count, key and value alternating
  kTuple = 16,   // varint count, the values
  kNone = 17,    // an empty std::optional
  kSome = 18,    // the value of an engaged std::optional follows
  kStruct = 19,  // a user type's fields, then kEnd
  kEnd = 20,
  kTensor = 32,  // at::Tensor (tensor.h)
  kRRef = 33,    // an RRef (rref.h)
  // A call's distributed autograd context, before its arguments: varint
  // context id, varint message id (tide/autograd/dist_autograd.h).
  kAutograd = 34,
};

class Decoder;
class Encoder;

namespace detail {
// What the rpc agent tells the codecs of one message: its RRef books and
// the worker at the other end (src/rpc/rrefs.h). Null outside an agent.
struct WireContext;

// Distributed autograd's record of one call, on the caller's side or the
// callee's (made by tide/autograd/dist_autograd.h, through the hooks of
// rpc.h): the tensor codec (tensor.h) reports to it every tensor requiring
// grad that the call's messages carry. Null outside a context.
class GradRecorder {
 public:
  GradRecorder(uint64_t context_id, uint64_t message_id)
      : context_id_(context_id), message_id_(message_id) {}
  virtual ~GradRecorder() = default;
  GradRecorder(const GradRecorder&) = delete;
  GradRecorder& operator=(const GradRecorder&) = delete;

  uint64_t context_id() const {
    return context_id_;
  }
  uint64_t message_id() const {
    return message_id_;
  }
  // On the callee, around the function the call runs: its own calls record
  // into the same context. Called once each, on one thread.
  virtual void enter() = 0;
  virtual void leave() = 0;

 private:
  const uint64_t context_id_;
  const uint64_t message_id_;
};
}  // namespace detail

// How tide encodes a T: a specialisation with
//   static void write(Encoder&, const T&);
//   static T read(Decoder&);
// read() throws InvalidArgument (through Decoder::fail or mismatch) for
// input it cannot take. Codecs encode their parts with detail::write and
// decode them with detail::read, not encode()/decode() (which count a user
// type's fields). For types tide supports; user types use the members.
template <typename T>
struct Codec;

// Appends encoded values to a string.
class Encoder {
 public:
  // Appends to `out`. `buffers`, when given, receives out-of-band buffers
  // (add_buffer). Both must outlive the encoder.
  explicit Encoder(std::string& out, std::vector<Buffer>* buffers = nullptr)
      : out_(out), buffers_(buffers) {}

  // Adds `data` to the out-of-band buffers and returns its index, which the
  // codec writes into the stream (write_varint) where the bytes would be.
  // The transport sends the buffers beside the stream, without copying
  // them, and hands them to the Decoder; tensors travel this way. Throws
  // InvalidArgument when the encoder has no buffers.
  size_t add_buffer(Buffer data) {
    if (buffers_ == nullptr) {
      throw InvalidArgument(
          "this Encoder has no out-of-band buffers; construct it with a "
          "std::vector<Buffer>* to send tensors or other buffers");
    }
    buffers_->push_back(std::move(data));
    return buffers_->size() - 1;
  }

  // The message's context, set by the rpc agent (RRefs need it).
  detail::WireContext* context() const {
    return context_;
  }
  void set_context(detail::WireContext* context) {
    context_ = context;
  }
  // The call's distributed autograd record, set by the rpc agent inside a
  // context (tensors need it).
  detail::GradRecorder* grads() const {
    return grads_;
  }
  void set_grads(detail::GradRecorder* grads) {
    grads_ = grads;
  }

  // The wire primitives, for codecs.
  void write_tag(Tag t) {
    out_.push_back(static_cast<char>(t));
  }
  // LEB128: 7 bits a byte, low bits first.
  void write_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  template <typename T>
  void write_fixed(T v) {
    static_assert(std::is_arithmetic_v<T>);
    write_raw(&v, sizeof v);
  }
  void write_raw(const void* data, size_t n) {
    if (n > 0) {
      out_.append(static_cast<const char*>(data), n);
    }
  }

  // Holds one level of nesting while a codec writes a container's values.
  // Throws InvalidArgument past kMaxDepth.
  class Nest {
   public:
    explicit Nest(Encoder& e) : e_(e) {
      if (e.depth_ == kMaxDepth) {
        throw InvalidArgument(
            "value nests more than " + std::to_string(kMaxDepth) +
            " containers deep (lists, arrays, maps, tuples, structs); "
            "tide::rpc decodes no deeper");
      }
      ++e.depth_;
    }
    ~Nest() {
      --e_.depth_;
    }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Encoder& e_;
  };

 private:
  std::string& out_;
  std::vector<Buffer>* buffers_;
  detail::WireContext* context_ = nullptr;
  detail::GradRecorder* grads_ = nullptr;
  int depth_ = 0;
};

namespace detail {

constexpr std::string_view tag_name(Tag t) {
  switch (t) {
    case Tag::kBool:
      return "bool";
    case Tag::kI8:
      return "i8";
    case Tag::kI16:
      return "i16";
    case Tag::kI32:
      return "i32";
    case Tag::kI64:
      return "i64";
    case Tag::kU8:
      return "u8";
    case Tag::kU16:
      return "u16";
    case Tag::kU32:
      return "u32";
    case Tag::kU64:
      return "u64";
    case Tag::kF32:
      return "f32";
    case Tag::kF64:
      return "f64";
    case Tag::kString:
      return "string";
    case Tag::kList:
      return "list";
    case Tag::kArray:
      return "array";
    case Tag::kMap:
      return "map";
    case Tag::kTuple:
      return "tuple";
    case Tag::kNone:
      return "none";
    case Tag::kSome:
      return "optional";
    case Tag::kStruct:
      return "struct";
    case Tag::kEnd:
      return "end of struct";
    case Tag::kTensor:
      return "tensor";
    case Tag::kRRef:
      return "rref";
    case Tag::kAutograd:
      return "autograd context";
  }
  return {};
}

// The bytes of a scalar tag's value; 0 for the other tags.
constexpr size_t scalar_width(Tag t) {
  switch (t) {
    case Tag::kI8:
    case Tag::kU8:
      return 1;
    case Tag::kI16:
    case Tag::kU16:
      return 2;
    case Tag::kI32:
    case Tag::kU32:
    case Tag::kF32:
      return 4;
    case Tag::kI64:
    case Tag::kU64:
    case Tag::kF64:
      return 8;
    default:
      return 0;
  }
}

inline std::string format_double(double v) {
  std::array<char, 32> buf{};
  std::snprintf(buf.data(), buf.size(), "%.17g", v);
  return buf.data();
}

}  // namespace detail

// Reads encoded values from a string, checking every length against the
// input and every tag against the type asked for. Keeps the path to the
// value being read (argument, element, field) for its error messages.
class Decoder {
 public:
  // Reads `in`; `buffers` are the out-of-band buffers sent with it. Both
  // must outlive the decoder.
  explicit Decoder(std::string_view in, std::span<const Buffer> buffers = {})
      : in_(in), buffers_(buffers) {}

  // The message's context, set by the rpc agent (RRefs need it).
  detail::WireContext* context() const {
    return context_;
  }
  void set_context(detail::WireContext* context) {
    context_ = context;
  }
  // The worker whose message this is (its authenticated connection's),
  // -1 outside one.
  int caller() const;
  // The call's distributed autograd record, set by the rpc agent inside a
  // context (tensors need it).
  detail::GradRecorder* grads() const {
    return grads_;
  }
  void set_grads(detail::GradRecorder* grads) {
    grads_ = grads;
  }

  size_t offset() const {
    return pos_;
  }
  size_t remaining() const {
    return in_.size() - pos_;
  }
  bool at_end() const {
    return pos_ == in_.size();
  }
  // Throws InvalidArgument unless the input was read to its end.
  void finish() const {
    if (!at_end()) {
      fail(
          std::to_string(remaining()) +
          (remaining() == 1 ? " byte" : " bytes") + " left after the value");
    }
  }

  // Out-of-band buffer `index` (Encoder::add_buffer). Throws
  // InvalidArgument when there is no such buffer.
  const Buffer& buffer(uint64_t index) const {
    if (index >= buffers_.size()) {
      fail(
          "buffer " + std::to_string(index) + " does not exist; " +
          std::to_string(buffers_.size()) + " came with the message");
    }
    return buffers_[index];
  }

  // The wire primitives, for codecs. Each throws InvalidArgument when the
  // input ends first.
  Tag peek_tag() const {
    if (at_end()) {
      truncated(1);
    }
    return static_cast<Tag>(in_[pos_]);
  }
  Tag read_tag() {
    Tag t = peek_tag();
    ++pos_;
    return t;
  }
  uint64_t read_varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      auto b = static_cast<uint8_t>(*take(1));
      if (shift == 63 && b > 1) {
        fail("varint does not fit in 64 bits");
      }
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        return v;
      }
    }
  }
  template <typename T>
  T read_fixed() {
    static_assert(std::is_arithmetic_v<T>);
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string_view read_raw(size_t n) {
    return {take(n), n};
  }
  // A varint count of items that take at least `min_bytes` each, checked
  // against the input left before anything is allocated for them. `what`
  // names the container for the error.
  uint64_t read_count(std::string_view what, size_t min_bytes) {
    uint64_t n = read_varint();
    if (n > remaining() / min_bytes) {
      fail(
          std::string(what) + " of length " + std::to_string(n) +
          " cannot fit in the " + std::to_string(remaining()) + " bytes left");
    }
    return n;
  }

  // Throws InvalidArgument with `what` after the path to the current value.
  [[noreturn]] void fail(std::string_view what) const {
    std::string msg;
    for (size_t i = 0; i < path_size_; ++i) {
      const PathEntry& p = path_[i];
      std::string index = std::to_string(p.index);
      switch (p.step) {
        case Step::kCall:
          msg.append(p.name).append("()");
          break;
        case Step::kResult:
          msg += "result";
          break;
        case Step::kArgument:
          msg += "argument " + std::to_string(p.index + 1);
          break;
        case Step::kElement:
          msg += "[" + index + "]";
          break;
        case Step::kMapKey:
          msg += "map entry " + index + " key";
          break;
        case Step::kMapValue:
          msg += "map entry " + index + " value";
          break;
        case Step::kTupleItem:
          msg += "tuple item " + index;
          break;
        case Step::kField:
          msg += p.name;
          if (p.index > 0) {
            msg += " field " + index;
          }
          break;
      }
      msg += ": ";
    }
    msg += what;
    throw InvalidArgument(msg);
  }
  // Throws "expected <expected>, got <got>"; `got` is the tag just read.
  [[noreturn]] void mismatch(std::string_view expected, Tag got) const {
    std::string what = "expected " + std::string(expected) + ", got ";
    std::string_view name = detail::tag_name(got);
    if (name.empty()) {
      std::array<char, 8> hex{};
      std::snprintf(hex.data(), hex.size(), "0x%02x", static_cast<int>(got));
      what.append("unknown type tag ").append(hex.data());
    } else {
      what += name;
    }
    if (got == Tag::kArray && !at_end()) {
      std::string_view element = detail::tag_name(static_cast<Tag>(in_[pos_]));
      if (!element.empty()) {
        what.append(" of ").append(element);
      }
    }
    fail(what);
  }

  // A step on the path to the current value.
  enum class Step : uint8_t {
    kCall,       // name(): decode_args, decode_result
    kResult,     // result
    kArgument,   // argument i+1
    kElement,    // [i]
    kMapKey,     // map entry i key
    kMapValue,   // map entry i value
    kTupleItem,  // tuple item i
    kField,      // name field i (1-based; 0: the struct itself)
  };

  // Holds one step of the path while a codec reads a container's values;
  // every step but kCall and kResult is one level of nesting. Throws
  // InvalidArgument past kMaxDepth.
  class Nest {
   public:
    Nest(Decoder& d, Step step, std::string_view name = {}) : d_(d) {
      bool nests = step != Step::kCall && step != Step::kResult;
      if (nests && d.depth_ == kMaxDepth) {
        d.fail(
            "value nests more than " + std::to_string(kMaxDepth) +
            " containers deep");
      }
      if (d.path_size_ == d.path_.size()) {
        throw InternalError("tide::rpc::Decoder: more than one call or result");
      }
      d.path_[d.path_size_++] = PathEntry{step, 0, name};
      d.depth_ += nests ? 1 : 0;
      nests_ = nests;
    }
    ~Nest() {
      --d_.path_size_;
      d_.depth_ -= nests_ ? 1 : 0;
    }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

    void at(uint64_t index) {
      d_.path_[d_.path_size_ - 1].index = index;
    }
    void at(Step step, uint64_t index) {
      d_.path_[d_.path_size_ - 1].step = step;
      at(index);
    }
    uint64_t index() const {
      return d_.path_[d_.path_size_ - 1].index;
    }

   private:
    Decoder& d_;
    bool nests_ = false;
  };

  // Called by decode() before each value: inside a user type's
  // deserialize(), counts the field and fails when the sender wrote fewer.
  void next_field() {
    if (path_size_ == 0 || path_[path_size_ - 1].step != Step::kField) {
      return;
    }
    uint64_t field = ++path_[path_size_ - 1].index;
    if (peek_tag() == Tag::kEnd) {
      fail(
          "not sent; the sender wrote " + std::to_string(field - 1) +
          " fields");
    }
  }

 private:
  struct PathEntry {
    Step step = Step::kCall;
    uint64_t index = 0;
    std::string_view name;
  };

  const char* take(size_t n) {
    if (remaining() < n) {
      truncated(n);
    }
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  [[noreturn]] void truncated(size_t n) const {
    fail(
        "truncated input: " + std::to_string(n) + " more bytes needed at " +
        "offset " + std::to_string(pos_) + ", " + std::to_string(remaining()) +
        " left");
  }

  std::string_view in_;
  std::span<const Buffer> buffers_;
  detail::WireContext* context_ = nullptr;
  detail::GradRecorder* grads_ = nullptr;
  size_t pos_ = 0;
  // Nesting levels and at most one kCall and one kResult.
  std::array<PathEntry, kMaxDepth + 2> path_;
  size_t path_size_ = 0;
  int depth_ = 0;
};

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
