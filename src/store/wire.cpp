#include "store/wire.h"

#include <array>

#include "tide/common/error.h"

namespace tide::store::wire {

namespace {

constexpr uint8_t kNone = 0xFF;

// Codes by op, per dialect. Legacy also serves the 2.0/2.1-era additions
// (9..12), which no 1.13 client sends.
constexpr std::array<uint8_t, kNumOps> kLegacyCodes = {
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    8,  // set .. num_keys, delete_key (7 = WATCH_KEY)
    9,
    10,
    11,
    12,  // append, multi_get, multi_set, cancel_wait
    kNone,
    kNone,  // ping, validate
    kNone,
    kNone,
    kNone,  // queues
    kAuthCode,
    kAddWaitCode};
constexpr std::array<uint8_t, kNumOps> kModernCodes = {
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,  // set .. num_keys, delete_key
    9,
    10,
    11,
    12,  // append, multi_get, multi_set, cancel_wait
    13,
    0,  // ping, validate
    14,
    15,
    16,  // queue push, pop, len
    kAuthCode,
    kAddWaitCode};

const std::array<uint8_t, kNumOps>& codes(Dialect d) {
  return d == Dialect::kModern ? kModernCodes : kLegacyCodes;
}

// Walks a request without copying until it is known to be whole.
class Cursor {
 public:
  Cursor(std::string_view in, const StoreLimits& limits)
      : in_(in), limits_(limits) {}

  // False when fewer than n bytes remain; records how many are needed.
  bool have(size_t n) {
    if (in_.size() - pos_ >= n) {
      return true;
    }
    need_ = pos_ + n;
    return false;
  }
  size_t pos() const {
    return pos_;
  }
  size_t need() const {
    return need_;
  }

  template <typename T>
  bool read(T& v) {
    if (!have(sizeof v)) {
      return false;
    }
    v = load<T>(in_.data() + pos_);
    pos_ += sizeof v;
    return true;
  }

  // A u64-length-prefixed string, checked against `max` before its bytes.
  bool string(std::string& s, size_t max, const char* what) {
    uint64_t len = 0;
    if (!read(len)) {
      return false;
    }
    if (len > max) {
      throw ProtocolError(
          std::string(what) + " of " + std::to_string(len) +
          " bytes exceeds the limit of " + std::to_string(max));
    }
    charge(len);
    if (!have(len)) {
      return false;
    }
    s.assign(in_.data() + pos_, len);
    pos_ += len;
    return true;
  }

  bool key(std::string& s) {
    return string(s, limits_.max_key_bytes, "key");
  }
  bool value(std::string& s) {
    return string(s, limits_.max_value_bytes, "value");
  }

  bool count(uint64_t& n) {
    if (!read(n)) {
      return false;
    }
    if (n > limits_.max_keys_per_call) {
      throw ProtocolError(
          "request names " + std::to_string(n) + " keys; the limit is " +
          std::to_string(limits_.max_keys_per_call));
    }
    return true;
  }

 private:
  // Counts payload bytes against max_request_bytes.
  void charge(uint64_t n) {
    total_ += n;
    if (total_ > limits_.max_request_bytes) {
      throw ProtocolError(
          "request of more than " + std::to_string(total_) +
          " bytes exceeds the limit of " +
          std::to_string(limits_.max_request_bytes));
    }
  }

  std::string_view in_;
  const StoreLimits& limits_;
  size_t pos_ = 0;
  size_t need_ = 0;
  uint64_t total_ = 0;
};

bool decode_keys(Cursor& c, Request& out) {
  uint64_t n = 0;
  if (!c.count(n)) {
    return false;
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (!c.key(out.keys.emplace_back())) {
      return false;
    }
  }
  return true;
}

bool decode_args(Cursor& c, Request& out) {
  switch (out.op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      out.keys.resize(1);
      out.values.resize(1);
      return c.key(out.keys[0]) && c.value(out.values[0]);
    case Op::kCompareSet:
      out.keys.resize(1);
      out.values.resize(2);
      return c.key(out.keys[0]) && c.value(out.values[0]) &&
             c.value(out.values[1]);
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      out.keys.resize(1);
      return c.key(out.keys[0]);
    case Op::kAdd:
      out.keys.resize(1);
      return c.key(out.keys[0]) && c.read(out.delta);
    case Op::kAddWait:
      out.keys.resize(2);
      return c.key(out.keys[0]) && c.read(out.delta) && c.read(out.target) &&
             c.key(out.keys[1]);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return decode_keys(c, out);
    case Op::kMultiSet: {
      uint64_t n = 0;
      if (!c.count(n)) {
        return false;
      }
      for (uint64_t i = 0; i < n; ++i) {
        if (!c.key(out.keys.emplace_back()) ||
            !c.value(out.values.emplace_back())) {
          return false;
        }
      }
      return true;
    }
    case Op::kNumKeys:
    case Op::kCancelWait:
      return true;
    case Op::kPing:
    case Op::kValidate:
      return c.read(out.number);
    case Op::kAuth:
      out.values.resize(1);
      return c.string(out.values[0], 4096, "token");
  }
  TIDE_CHECK(false);
}

}  // namespace

const char* op_name(Op op) {
  static constexpr std::array<const char*, kNumOps> kNames = {
      "SET",
      "COMPARE_SET",
      "GET",
      "ADD",
      "CHECK",
      "WAIT",
      "GETNUMKEYS",
      "DELETE_KEY",
      "APPEND",
      "MULTI_GET",
      "MULTI_SET",
      "CANCEL_WAIT",
      "PING",
      "VALIDATE",
      "QUEUE_PUSH",
      "QUEUE_POP",
      "QUEUE_LEN",
      "AUTH",
      "ADD_WAIT"};
  return kNames[static_cast<size_t>(op)];
}

std::optional<uint8_t> op_code(Op op, Dialect d) {
  uint8_t c = codes(d)[static_cast<size_t>(op)];
  if (c == kNone) {
    return std::nullopt;
  }
  return c;
}

std::optional<Op> op_from_code(uint8_t code, Dialect d) {
  const auto& table = codes(d);
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i] == code) {
      return static_cast<Op>(i);
    }
  }
  return std::nullopt;
}

Decoded decode_request(
    std::string_view in,
    Dialect dialect,
    const StoreLimits& limits,
    Request& out) {
  if (in.empty()) {
    return {.consumed = 0, .need = 1};
  }
  auto code = static_cast<uint8_t>(in[0]);
  std::optional<Op> op = op_from_code(code, dialect);
  if (!op) {
    throw ProtocolError(
        "unknown command code " + std::to_string(code) + " in the " +
        (dialect == Dialect::kModern ? "modern" : "legacy") + " dialect");
  }
  out.op = *op;
  out.keys.clear();
  out.values.clear();
  out.delta = 0;
  out.target = 0;
  out.number = 0;
  Cursor c(in.substr(1), limits);
  if (!decode_args(c, out)) {
    return {.consumed = 0, .need = 1 + c.need()};
  }
  return {.consumed = 1 + c.pos(), .need = 0};
}

Decoded decode_tagged(
    std::string_view in, const StoreLimits& limits, Tagged& tag, Request& out) {
  if (in.size() < kTaggedHeader) {
    return {.consumed = 0, .need = kTaggedHeader};
  }
  tag.tag = load<uint64_t>(in.data() + 1);
  tag.wait_ms = load<uint64_t>(in.data() + 1 + sizeof(uint64_t));
  std::string_view body = in.substr(kTaggedHeader);
  if (!body.empty() && (static_cast<uint8_t>(body[0]) == kTaggedCode ||
                        static_cast<uint8_t>(body[0]) == kAuthCode)) {
    throw ProtocolError("a tagged frame cannot hold AUTH or another frame");
  }
  Decoded d = decode_request(body, Dialect::kModern, limits, out);
  if (d.consumed == 0) {
    return {.consumed = 0, .need = kTaggedHeader + d.need};
  }
  if (out.op == Op::kValidate || out.op == Op::kCancelWait) {
    throw ProtocolError(
        std::string("a tagged frame cannot hold ") + op_name(out.op) +
        " (a tagged WAIT ends at its own bound)");
  }
  return {.consumed = kTaggedHeader + d.consumed, .need = 0};
}

void encode_request(
    const Request& req, Dialect d, std::string& out, const Tagged* tag) {
  std::optional<uint8_t> code = op_code(req.op, d);
  if (!code) {
    throw InvalidArgument(
        std::string(op_name(req.op)) +
        " needs the modern dialect; torch 1.13 servers do not have it");
  }
  Writer w(out);
  if (tag) {
    w.u8(kTaggedCode).u64(tag->tag).u64(tag->wait_ms);
  }
  w.u8(*code);
  auto keys = [&] {
    w.u64(req.keys.size());
    for (const auto& k : req.keys) {
      w.str(k);
    }
  };
  switch (req.op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      w.str(req.keys.at(0)).str(req.values.at(0));
      return;
    case Op::kCompareSet:
      w.str(req.keys.at(0)).str(req.values.at(0)).str(req.values.at(1));
      return;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      w.str(req.keys.at(0));
      return;
    case Op::kAdd:
      w.str(req.keys.at(0)).i64(req.delta);
      return;
    case Op::kAddWait:
      w.str(req.keys.at(0)).i64(req.delta).i64(req.target).str(req.keys.at(1));
      return;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      keys();
      return;
    case Op::kMultiSet:
      w.u64(req.keys.size());
      for (size_t i = 0; i < req.keys.size(); ++i) {
        w.str(req.keys[i]).str(req.values.at(i));
      }
      return;
    case Op::kNumKeys:
    case Op::kCancelWait:
      return;
    case Op::kPing:
    case Op::kValidate:
      w.u32(req.number);
      return;
    case Op::kAuth:
      w.str(req.values.at(0));
      return;
  }
  TIDE_CHECK(false);
}

bool has_reply(Op op) {
  switch (op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kValidate:
      return false;
    default:
      return true;
  }
}

size_t decode_reply(std::string_view in, const Request& req, Reply& out) {
  size_t pos = 0;
  auto fixed = [&](size_t n) {
    if (in.size() - pos < n) {
      return false;
    }
    pos += n;
    return true;
  };
  auto string = [&](std::string& s) {
    if (in.size() - pos < sizeof(uint64_t)) {
      return false;
    }
    auto len = load<uint64_t>(in.data() + pos);
    if (len > (uint64_t{1} << 40)) {
      throw ProtocolError(
          "a store announced a value of " + std::to_string(len) + " bytes");
    }
    if (in.size() - pos - sizeof(uint64_t) < len) {
      return false;
    }
    s.assign(in.data() + pos + sizeof(uint64_t), len);
    pos += sizeof(uint64_t) + len;
    return true;
  };
  out.values.clear();
  switch (req.op) {
    case Op::kCheck:
    case Op::kWait:
    case Op::kCancelWait:
    case Op::kAuth:
      if (!fixed(1)) {
        return 0;
      }
      out.byte = static_cast<uint8_t>(in[0]);
      return pos;
    case Op::kAdd:
    case Op::kNumKeys:
    case Op::kDeleteKey:
    case Op::kQueueLen:
      if (!fixed(sizeof(int64_t))) {
        return 0;
      }
      out.number = load<int64_t>(in.data());
      return pos;
    case Op::kPing:
      if (!fixed(sizeof(uint32_t))) {
        return 0;
      }
      out.number = load<uint32_t>(in.data());
      return pos;
    case Op::kGet:
    case Op::kCompareSet:
      return string(out.values.emplace_back()) ? pos : 0;
    case Op::kMultiGet:
      for (size_t i = 0; i < req.keys.size(); ++i) {
        if (!string(out.values.emplace_back())) {
          return 0;
        }
      }
      return pos;
    case Op::kQueuePop:
      if (!fixed(sizeof(int64_t))) {
        return 0;
      }
      out.number = load<int64_t>(in.data());
      if (out.number > 0 && !string(out.values.emplace_back())) {
        return 0;
      }
      return pos;
    case Op::kAddWait:
      if (!fixed(sizeof(int64_t))) {
        return 0;
      }
      out.number = load<int64_t>(in.data());
      return string(out.values.emplace_back()) ? pos : 0;
    case Op::kSet:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kValidate:
      return 0;
  }
  TIDE_CHECK(false);
}

void encode_reply(const Reply& reply, Op op, std::string& out) {
  Writer w(out);
  switch (op) {
    case Op::kCheck:
    case Op::kWait:
    case Op::kCancelWait:
    case Op::kAuth:
      w.u8(reply.byte);
      return;
    case Op::kAdd:
    case Op::kNumKeys:
    case Op::kDeleteKey:
    case Op::kQueueLen:
      w.i64(reply.number);
      return;
    case Op::kPing:
      w.u32(static_cast<uint32_t>(reply.number));
      return;
    case Op::kGet:
    case Op::kCompareSet:
    case Op::kMultiGet:
      for (const auto& v : reply.values) {
        w.str(v);
      }
      return;
    case Op::kQueuePop:
    case Op::kAddWait:
      w.i64(reply.number);
      for (const auto& v : reply.values) {
        w.str(v);
      }
      return;
    case Op::kSet:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kValidate:
      return;
  }
  TIDE_CHECK(false);
}

std::optional<Dialect> detect_dialect(std::string_view in) {
  if (in.empty()) {
    return std::nullopt;
  }
  if (in[0] != 0) {
    return Dialect::kLegacy;
  }
  if (in.size() < 5) {
    return std::nullopt;
  }
  // A legacy SET would need a key length of at least 0x3C85F7CE here, far
  // over any limit, so the magic cannot be mistaken.
  return load<uint32_t>(in.data() + 1) == kValidateMagic ? Dialect::kModern
                                                         : Dialect::kLegacy;
}

}  // namespace tide::store::wire
