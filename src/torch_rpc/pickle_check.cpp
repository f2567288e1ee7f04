// The opcodes and argument layouts are pickle's own (Python's pickletools
// documents them); written here as a table of what follows each opcode.
#include "torch_rpc/pickle_check.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "tide/common/error.h"

namespace tide::torch_rpc {

namespace {

// What follows an opcode.
enum class Arg : uint8_t {
  kInvalid,  // not an opcode
  kNone,
  kFixed1,
  kFixed2,
  kFixed4,
  kFixed8,
  kLine,      // text up to a newline
  kTwoLines,  // two of them (GLOBAL, INST)
  kLen1,      // a u8 length, then that many bytes
  kLen4,      // a u32 length, then that many bytes
  kLen8,      // a u64 length, then that many bytes
  kFrame,     // a u64 length of the frame that follows (not skipped)
  kPut1,      // memo index u8
  kPut4,      // memo index u32
  kGet1,
  kGet4,
  kMemoize,  // the next memo index
  kPutLine,  // memo index as text
  kGetLine,
};

constexpr std::array<Arg, 256> table() {
  std::array<Arg, 256> t{};
  auto set = [&t](unsigned char op, Arg a) { t[op] = a; };
  for (unsigned char op : {'(', '.', '0', '1', '2', 'N', 'Q', 'R', 'a', 'b',
                           'd', '}', 'e', 'l', ']', 'o', 's', 't', ')', 'u'}) {
    set(op, Arg::kNone);
  }
  // Protocol 2 and later, without arguments.
  for (unsigned char op :
       {0x81,
        0x85,
        0x86,
        0x87,
        0x88,
        0x89,
        0x8f,
        0x90,
        0x91,
        0x92,
        0x93,
        0x97,
        0x98}) {
    set(op, Arg::kNone);
  }
  set('K', Arg::kFixed1);
  set(0x80, Arg::kFixed1);  // PROTO
  set(0x82, Arg::kFixed1);  // EXT1
  set('M', Arg::kFixed2);
  set(0x83, Arg::kFixed2);  // EXT2
  set('J', Arg::kFixed4);
  set(0x84, Arg::kFixed4);  // EXT4
  set('G', Arg::kFixed8);
  for (unsigned char op : {'F', 'I', 'L', 'P', 'S', 'V'}) {
    set(op, Arg::kLine);
  }
  set('c', Arg::kTwoLines);
  set('i', Arg::kTwoLines);
  set('U', Arg::kLen1);
  set('C', Arg::kLen1);
  set(0x8c, Arg::kLen1);  // SHORT_BINUNICODE
  set(0x8a, Arg::kLen1);  // LONG1
  set('T', Arg::kLen4);
  set('X', Arg::kLen4);
  set('B', Arg::kLen4);
  set(0x8b, Arg::kLen4);  // LONG4
  set(0x8d, Arg::kLen8);  // BINUNICODE8
  set(0x8e, Arg::kLen8);  // BINBYTES8
  set(0x96, Arg::kLen8);  // BYTEARRAY8
  set(0x95, Arg::kFrame);
  set('q', Arg::kPut1);
  set('r', Arg::kPut4);
  set('h', Arg::kGet1);
  set('j', Arg::kGet4);
  set(0x94, Arg::kMemoize);
  set('p', Arg::kPutLine);
  set('g', Arg::kGetLine);
  return t;
}

constexpr std::array<Arg, 256> kArgs = table();

}  // namespace

void check_pickle(std::string_view p) {
  size_t at = 0;
  uint64_t memo = 0;  // entries put so far (indices 0 .. memo-1)
  auto fail = [&](size_t op_at, const std::string& what) {
    char op[8];
    std::snprintf(
        op, sizeof op, "0x%02x", static_cast<unsigned char>(p[op_at]));
    throw ProtocolError(
        "a pickle the peer sent: opcode " + std::string(op) + " at byte " +
        std::to_string(op_at) + " " + what);
  };
  auto fixed = [&](size_t op_at, size_t n) -> uint64_t {
    if (p.size() - at < n) {
      fail(op_at, "is cut short");
    }
    uint64_t v = 0;
    std::memcpy(&v, p.data() + at, n);  // little-endian, as pickle's
    at += n;
    return v;
  };
  auto line = [&](size_t op_at) -> std::string_view {
    size_t end = p.find('\n', at);
    if (end == std::string_view::npos) {
      fail(op_at, "has no end of line");
    }
    std::string_view text = p.substr(at, end - at);
    at = end + 1;
    return text;
  };
  auto put = [&](size_t op_at, uint64_t index) {
    if (index > memo) {
      fail(
          op_at,
          "puts memo entry " + std::to_string(index) + " with " +
              std::to_string(memo) + " put so far");
    }
    memo = std::max(memo, index + 1);
  };
  auto get = [&](size_t op_at, uint64_t index) {
    if (index >= memo) {
      fail(op_at, "gets memo entry " + std::to_string(index) + ", never put");
    }
  };
  auto index_text = [&](size_t op_at, std::string_view text) -> uint64_t {
    uint64_t v = 0;
    if (text.empty() || text.size() > 9) {
      fail(op_at, "has a memo index that is not a number");
    }
    for (char c : text) {
      if (c < '0' || c > '9') {
        fail(op_at, "has a memo index that is not a number");
      }
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    return v;
  };
  while (at < p.size()) {
    size_t op_at = at;
    auto op = static_cast<unsigned char>(p[at++]);
    switch (kArgs[op]) {
      case Arg::kInvalid:
        fail(op_at, "is not a pickle opcode");
        break;
      case Arg::kNone:
        if (op == '.') {
          if (at != p.size()) {
            fail(op_at, "(STOP) has bytes after it");
          }
          return;
        }
        break;
      case Arg::kFixed1:
        fixed(op_at, 1);
        break;
      case Arg::kFixed2:
        fixed(op_at, 2);
        break;
      case Arg::kFixed4:
        fixed(op_at, 4);
        break;
      case Arg::kFixed8:
        fixed(op_at, 8);
        break;
      case Arg::kLine:
        line(op_at);
        break;
      case Arg::kTwoLines:
        line(op_at);
        line(op_at);
        break;
      case Arg::kLen1:
      case Arg::kLen4:
      case Arg::kLen8: {
        size_t width = kArgs[op] == Arg::kLen1   ? 1
                       : kArgs[op] == Arg::kLen4 ? 4
                                                 : 8;
        uint64_t n = fixed(op_at, width);
        if (n > p.size() - at) {
          fail(
              op_at,
              "claims " + std::to_string(n) + " bytes, and " +
                  std::to_string(p.size() - at) + " are left");
        }
        at += n;
        break;
      }
      case Arg::kFrame: {
        uint64_t n = fixed(op_at, 8);
        if (n > p.size() - at) {
          fail(
              op_at,
              "(FRAME) claims " + std::to_string(n) + " bytes, and " +
                  std::to_string(p.size() - at) + " are left");
        }
        break;
      }
      case Arg::kPut1:
        put(op_at, fixed(op_at, 1));
        break;
      case Arg::kPut4:
        put(op_at, fixed(op_at, 4));
        break;
      case Arg::kGet1:
        get(op_at, fixed(op_at, 1));
        break;
      case Arg::kGet4:
        get(op_at, fixed(op_at, 4));
        break;
      case Arg::kMemoize:
        put(op_at, memo);
        break;
      case Arg::kPutLine:
        put(op_at, index_text(op_at, line(op_at)));
        break;
      case Arg::kGetLine:
        get(op_at, index_text(op_at, line(op_at)));
        break;
    }
  }
  throw ProtocolError("a pickle the peer sent has no STOP");
}

}  // namespace tide::torch_rpc
