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

// The byte stream of tide's rpc serialization (docs/rpc-serialization.md):
// the tag before every value, and the Encoder and Decoder that write and
// read tags, varints and raw bytes, keep the path to the value being read
// for errors, and carry what a message's codecs need to know (out-of-band
// buffers, the peer's RRef books, distributed autograd's record). The codecs
// of each type are tide/rpc/codecs.h; the API, tide/rpc/serialize.h.
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
class RRefBooks;      // src/rpc/rrefs.h
class ArgumentWaits;  // src/rpc/rrefs.h
class GradRecorder;

// What the codecs of one message need besides its bytes: the rpc agent
// makes one for each message it encodes or decodes, and the Encoder or
// Decoder points to it. Outside an agent there is none (null).
struct MessageContext {
  // The agent's RRef books, and the worker at the other end (RRefs).
  RRefBooks* books = nullptr;
  int peer = -1;
  // Distributed autograd's record of the call, inside a context (tensors).
  GradRecorder* grads = nullptr;
  // A request being served: where the RRefs its arguments bring leave the
  // confirmations the function waits for.
  ArgumentWaits* waits = nullptr;
};

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

  // The message's context, set by the rpc agent; it must outlive the
  // coder. Null outside an agent.
  const detail::MessageContext* context() const {
    return context_;
  }
  void set_context(const detail::MessageContext* context) {
    context_ = context;
  }
  // The call's distributed autograd record (the context's), or null.
  detail::GradRecorder* grads() const {
    return context_ != nullptr ? context_->grads : nullptr;
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
  const detail::MessageContext* context_ = nullptr;
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

  // The message's context, set by the rpc agent; it must outlive the
  // coder. Null outside an agent.
  const detail::MessageContext* context() const {
    return context_;
  }
  void set_context(const detail::MessageContext* context) {
    context_ = context;
  }
  // The worker whose message this is (its authenticated connection's),
  // -1 outside one.
  int caller() const {
    return context_ != nullptr ? context_->peer : -1;
  }
  // The call's distributed autograd record (the context's), or null.
  detail::GradRecorder* grads() const {
    return context_ != nullptr ? context_->grads : nullptr;
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
  const detail::MessageContext* context_ = nullptr;
  size_t pos_ = 0;
  // Nesting levels and at most one kCall and one kResult.
  std::array<PathEntry, kMaxDepth + 2> path_;
  size_t path_size_ = 0;
  int depth_ = 0;
};

}  // namespace tide::rpc
