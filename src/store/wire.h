#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tide/store/tcp_store.h"

// The TCPStore wire format (docs/store-protocol.md): a request is one command
// byte and its arguments, with no length header; integers are little-endian;
// strings are a u64 length and the bytes. This file holds the codes of both
// dialects, the request decoder (pure, no I/O, fuzzed) and the encoders.
namespace tide::store::wire {

static_assert(
    std::endian::native == std::endian::little,
    "the TCPStore protocol is host-endian; tide supports little-endian hosts");

constexpr uint32_t kValidateMagic = 0x3C85F7CE;

// tide's own commands, the same code in both dialects, unused by torch.
constexpr uint8_t kAuthCode = 0xA7;
// A tagged frame (modern dialect only): u64 tag, u64 wait bound in ms, then
// one request. Its reply is the u64 tag then the request's reply, and a
// WAIT in it does not hold up the connection: many callers share one
// connection, each reply found by its tag (docs/store-protocol.md).
constexpr uint8_t kTaggedCode = 0xA8;
constexpr size_t kTaggedHeader = 1 + 2 * sizeof(uint64_t);
// ADD_WAIT: an ADD whose reply waits for another key (a vote in one
// exchange, docs/store-protocol.md).
constexpr uint8_t kAddWaitCode = 0xA9;

enum class Op : uint8_t {
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kValidate,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kAuth,
  kAddWait,
};

constexpr size_t kNumOps = static_cast<size_t>(Op::kAddWait) + 1;

const char* op_name(Op op);

// The code of op in dialect d, or nullopt when d has no such command.
std::optional<uint8_t> op_code(Op op, Dialect d);
// The op of a code in dialect d, or nullopt for an unknown code.
std::optional<Op> op_from_code(uint8_t code, Dialect d);

// Reply bytes.
constexpr uint8_t kCheckReady = 0;
constexpr uint8_t kCheckNotReady = 1;
constexpr uint8_t kStopWaiting = 0;
constexpr uint8_t kWaitCanceled = 1;
constexpr uint8_t kAuthOk = 0;
// A tagged WAIT's reply when its bound passed first.
constexpr uint8_t kWaitTimedOut = 2;

struct Request {
  Op op = Op::kSet;
  // Keys in order; for kCompareSet keys = {key}, values = {expected, desired}.
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t delta = 0;    // kAdd, kAddWait
  int64_t target = 0;   // kAddWait: keys = {counter, key}
  uint32_t number = 0;  // kPing nonce, kValidate magic
};

struct Decoded {
  // Bytes of `in` the request took; 0 when `in` holds only part of one.
  size_t consumed = 0;
  // When consumed == 0: no request can complete before `in` has this many
  // bytes, so the caller need not try again sooner.
  size_t need = 0;
};

// Decodes the request at the front of `in`. Throws ProtocolError for an
// unknown command or a length over `limits`, as soon as its bytes arrive
// (never waiting for a body that could not be accepted anyway).
Decoded decode_request(
    std::string_view in,
    Dialect dialect,
    const StoreLimits& limits,
    Request& out);

struct Tagged {
  uint64_t tag = 0;
  uint64_t wait_ms = 0;  // A WAIT's bound; 0: none
};

// Decodes the tagged frame at the front of `in` (its first byte is
// kTaggedCode). Throws ProtocolError, besides decode_request's cases, for a
// request that has no place in a frame: VALIDATE, AUTH, CANCEL_WAIT, or
// another frame.
Decoded decode_tagged(
    std::string_view in, const StoreLimits& limits, Tagged& tag, Request& out);

// Appends req in dialect d (a tagged frame when tag is set) to out; throws
// InvalidArgument for a command d does not have.
void encode_request(
    const Request& req,
    Dialect d,
    std::string& out,
    const Tagged* tag = nullptr);

// What a reply holds, by command: `byte` for CHECK, WAIT, CANCEL_WAIT and
// AUTH; `number` for ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN, PING, and
// QUEUE_POP's length and ADD_WAIT's count; `values` for GET, COMPARE_SET,
// MULTI_GET (one per key), QUEUE_POP (one when the length was > 0) and
// ADD_WAIT (one).
struct Reply {
  uint8_t byte = 0;
  int64_t number = 0;
  std::vector<std::string> values;
};

// Whether op has a reply (SET, APPEND, MULTI_SET, QUEUE_PUSH and VALIDATE
// have none).
bool has_reply(Op op);

// Decodes the reply to req at the front of `in`; returns the bytes it
// took, or 0 when `in` holds only part of it. Throws ProtocolError for a
// length no store would send.
size_t decode_reply(std::string_view in, const Request& req, Reply& out);

// Appends the reply to a request of op `op` to out.
void encode_reply(const Reply& reply, Op op, std::string& out);

// The dialect of a connection from its first bytes: kModern when they are a
// VALIDATE with the magic, kLegacy otherwise; nullopt when too few arrived.
std::optional<Dialect> detect_dialect(std::string_view in);

// Appends wire values to a buffer.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  Writer& u8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) {
    return raw(&v, sizeof v);
  }
  Writer& u64(uint64_t v) {
    return raw(&v, sizeof v);
  }
  Writer& i64(int64_t v) {
    return raw(&v, sizeof v);
  }
  Writer& str(std::string_view s) {
    u64(s.size());
    out_.append(s);
    return *this;
  }

 private:
  Writer& raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string& out_;
};

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace tide::store::wire
