// The JSON codec of etcd's v3 gateway: base64, reading replies, building
// requests, and what an error answer means.
#include "etcd/codec.h"

#include <array>
#include <charconv>
#include <limits>
#include <system_error>
#include <utility>

#include "tide/common/error.h"

namespace tide::etcd {

namespace {

constexpr std::string_view kBase64Alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

// Bytes for a message: printable ASCII as is, the rest as \xNN, cut at
// `max` characters.
std::string printable(std::string_view bytes, size_t max) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      constexpr std::string_view kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

// "put of key \"a/b\"": how messages name a call.
std::string describe(std::string_view call, std::string_view key) {
  return std::string(call) + " of key \"" + printable(key) + "\"";
}

// gRPC status code names, for etcd's {"code": N}.
std::string grpc_code_name(int64_t code) {
  static constexpr std::array<const char*, 17> kNames = {
      "OK",
      "Canceled",
      "Unknown",
      "InvalidArgument",
      "DeadlineExceeded",
      "NotFound",
      "AlreadyExists",
      "PermissionDenied",
      "ResourceExhausted",
      "FailedPrecondition",
      "Aborted",
      "OutOfRange",
      "Unimplemented",
      "Internal",
      "Unavailable",
      "DataLoss",
      "Unauthenticated"};
  if (code >= 0 && code < static_cast<int64_t>(kNames.size())) {
    return kNames[static_cast<size_t>(code)];
  }
  return "code " + std::to_string(code);
}

// --- reading etcd's JSON -------------------------------------------------
// The gateway leaves out every field at its default value and sends int64s
// as strings, so an absent field is 0, "" or false; a present field of the
// wrong type is a ProtocolError. `context` names the call for messages.

[[noreturn]] void bad_reply(
    const std::string& context, const std::string& what) {
  throw ProtocolError(
      context + ": etcd's reply is not what the v3 gateway sends: " + what);
}

const json* find_field(const json& object, const char* name) {
  if (!object.is_object()) {
    return nullptr;
  }
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const json& object_field(
    const json& object, const char* name, const std::string& context) {
  // Never destroyed: a keep-alive thread may still read it while the
  // process exits.
  static const json& kEmpty = *new json(json::object());
  const json* v = find_field(object, name);
  if (v == nullptr) {
    return kEmpty;
  }
  if (!v->is_object()) {
    bad_reply(context, std::string("\"") + name + "\" is not an object");
  }
  return *v;
}

const json& array_field(
    const json& object, const char* name, const std::string& context) {
  static const json& kEmpty = *new json(json::array());
  const json* v = find_field(object, name);
  if (v == nullptr) {
    return kEmpty;
  }
  if (!v->is_array()) {
    bad_reply(context, std::string("\"") + name + "\" is not an array");
  }
  return *v;
}

int64_t int_field(
    const json& object, const char* name, const std::string& context) {
  const json* v = find_field(object, name);
  if (v == nullptr) {
    return 0;
  }
  if (v->is_number_unsigned()) {
    auto u = v->get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
  } else if (v->is_number_integer()) {
    return v->get<int64_t>();
  } else if (v->is_string()) {
    const auto& s = v->get_ref<const std::string&>();
    int64_t n = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (!s.empty() && ec == std::errc() && ptr == s.data() + s.size()) {
      return n;
    }
  }
  bad_reply(
      context,
      std::string("\"") + name +
          "\" is not an int64: " + printable(v->dump(), 64));
}

bool bool_field(
    const json& object, const char* name, const std::string& context) {
  const json* v = find_field(object, name);
  if (v == nullptr) {
    return false;
  }
  if (!v->is_boolean()) {
    bad_reply(context, std::string("\"") + name + "\" is not a boolean");
  }
  return v->get<bool>();
}

std::string text_field(
    const json& object, const char* name, const std::string& context) {
  const json* v = find_field(object, name);
  if (v == nullptr) {
    return {};
  }
  if (!v->is_string()) {
    bad_reply(context, std::string("\"") + name + "\" is not a string");
  }
  return v->get<std::string>();
}

// A base64 field, decoded.
std::string bytes_field(
    const json& object, const char* name, const std::string& context) {
  std::string text = text_field(object, name, context);
  try {
    return base64_decode(text);
  } catch (const ProtocolError& e) {
    bad_reply(context, std::string("\"") + name + "\": " + e.what());
  }
}

KeyValue parse_kv(const json& j, const std::string& context) {
  if (!j.is_object()) {
    bad_reply(context, "a kv is not an object");
  }
  KeyValue kv;
  kv.key = bytes_field(j, "key", context);
  kv.value = bytes_field(j, "value", context);
  kv.create_revision = int_field(j, "create_revision", context);
  kv.mod_revision = int_field(j, "mod_revision", context);
  kv.version = int_field(j, "version", context);
  kv.lease = int_field(j, "lease", context);
  return kv;
}

int64_t header_revision(const json& reply, const std::string& context) {
  return int_field(object_field(reply, "header", context), "revision", context);
}

RangeResult parse_range(const json& reply, const std::string& context) {
  RangeResult r;
  for (const json& kv : array_field(reply, "kvs", context)) {
    r.kvs.push_back(parse_kv(kv, context));
  }
  r.count = int_field(reply, "count", context);
  r.revision = header_revision(reply, context);
  return r;
}

// --- building requests ---------------------------------------------------

json range_request(std::string_view key, const RangeOptions& options) {
  json r = json::object();
  r["key"] = base64_encode(key);
  std::string end = options.prefix ? prefix_range_end(key) : options.range_end;
  if (!end.empty()) {
    r["range_end"] = base64_encode(end);
  }
  if (options.count_only) {
    r["count_only"] = true;
  }
  if (options.keys_only) {
    r["keys_only"] = true;
  }
  if (options.limit > 0) {
    r["limit"] = std::to_string(options.limit);
  }
  if (options.max_create_revision > 0) {
    r["max_create_revision"] = std::to_string(options.max_create_revision);
  }
  if (options.min_create_revision > 0) {
    r["min_create_revision"] = std::to_string(options.min_create_revision);
  }
  return r;
}

json put_request(std::string_view key, std::string_view value, int64_t lease) {
  json r = json::object();
  r["key"] = base64_encode(key);
  r["value"] = base64_encode(value);
  if (lease != 0) {
    r["lease"] = std::to_string(lease);
  }
  return r;
}

json op(const char* kind, json request) {
  json o = json::object();
  o[kind] = std::move(request);
  return o;
}

// A transaction: when `compare` holds, put; else read the key back.
json txn_put_else_range(
    json compare, std::string_view key, std::string_view value, int64_t lease) {
  json t = json::object();
  t["compare"] = json::array({std::move(compare)});
  t["success"] =
      json::array({op("request_put", put_request(key, value, lease))});
  t["failure"] =
      json::array({op("request_range", range_request(key, RangeOptions{}))});
  return t;
}

TxnResult parse_txn(
    const json& reply, const char* failure_op, const std::string& context) {
  TxnResult r;
  r.succeeded = bool_field(reply, "succeeded", context);
  r.revision = header_revision(reply, context);
  if (!r.succeeded) {
    const json& responses = array_field(reply, "responses", context);
    if (responses.size() != 1) {
      bad_reply(context, "a failed transaction without its one read");
    }
    const json& range = object_field(responses[0], failure_op, context);
    const json& kvs = array_field(range, "kvs", context);
    if (!kvs.empty()) {
      r.current = parse_kv(kvs[0], context);
    }
  }
  return r;
}

// --- error answers -------------------------------------------------------

// What etcd's error body says, for messages: "etcdserver: request is too
// large (gRPC InvalidArgument)".
std::string etcd_error_text(const json& body) {
  std::string text;
  for (const char* name : {"message", "error"}) {
    const json* v = find_field(body, name);
    if (v != nullptr && v->is_string() &&
        !v->get_ref<const std::string&>().empty()) {
      text = v->get<std::string>();
      break;
    }
  }
  const json* code = find_field(body, "code");
  if (code != nullptr && code->is_number_integer()) {
    text += " (gRPC " + grpc_code_name(code->get<int64_t>()) + ")";
  }
  return text;
}

int64_t error_code(const json& reply) {
  const json* code = find_field(reply, "code");
  return code != nullptr && code->is_number_integer() ? code->get<int64_t>()
                                                      : -1;
}

[[noreturn]] void throw_error_reply(
    const std::string& context, long status, const json& reply) {
  std::string text = etcd_error_text(reply);
  if (text.empty()) {
    text = printable(reply.dump(), 200);
  }
  std::string msg =
      context + ": etcd answered HTTP " + std::to_string(status) + ": " + text;
  int64_t grpc = error_code(reply);
  // InvalidArgument, OutOfRange, and gRPC's own size limit (above
  // --max-request-bytes plus some slack) are the request's fault.
  bool too_large =
      grpc == 8 && text.find("larger than max") != std::string::npos;
  if (grpc == 3 || grpc == 11 || too_large) {
    throw InvalidArgument(msg);
  }
  throw RemoteError(msg);
}

// --- base64 ----------------------------------------------------------------

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t n =
        static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
        static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
        static_cast<unsigned char>(bytes[i + 2]);
    out += kBase64Alphabet[n >> 18];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += kBase64Alphabet[(n >> 6) & 63];
    out += kBase64Alphabet[n & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i]))
                 << 16;
    if (rest == 2) {
      n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    }
    out += kBase64Alphabet[n >> 18];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += rest == 2 ? kBase64Alphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(std::string_view text) {
  static const std::array<int8_t, 256> kValues = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    for (size_t i = 0; i < kBase64Alphabet.size(); ++i) {
      v[static_cast<unsigned char>(kBase64Alphabet[i])] =
          static_cast<int8_t>(i);
    }
    return v;
  }();
  auto fail = [&](const std::string& why) {
    throw ProtocolError("bad base64 \"" + printable(text, 64) + "\": " + why);
  };
  if (text.size() % 4 != 0) {
    fail("its length is not a multiple of 4");
  }
  size_t padding = 0;
  if (!text.empty() && text.back() == '=') {
    padding = text[text.size() - 2] == '=' ? 2 : 1;
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    uint32_t n = 0;
    for (size_t j = 0; j < 4; ++j) {
      char c = text[i + j];
      int8_t v = kValues[static_cast<unsigned char>(c)];
      if (c == '=' && last && j >= 4 - padding) {
        v = 0;
      } else if (v < 0) {
        fail(
            "unexpected '" + printable(std::string_view(&c, 1)) +
            "' at offset " + std::to_string(i + j));
      }
      n = n << 6 | static_cast<uint32_t>(v);
    }
    out += static_cast<char>(n >> 16);
    if (!last || padding < 2) {
      out += static_cast<char>((n >> 8) & 0xff);
    }
    if (!last || padding < 1) {
      out += static_cast<char>(n & 0xff);
    }
  }
  return out;
}

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace tide::etcd
