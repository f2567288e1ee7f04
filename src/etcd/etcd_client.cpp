// The etcd client: JSON requests over one kept-alive libcurl handle, a second
// handle for watch streams, and failover across the endpoints.
#include "etcd/etcd_client.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <exception>
#include <limits>
#include <memory>

#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

namespace tide::etcd {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::string_view kBase64Alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// Bytes for a message: printable ASCII as is, the rest as \xNN, cut at
// `max` characters.
std::string printable(std::string_view bytes, size_t max = 128) {
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

// --- libcurl ---------------------------------------------------------------

void init_curl_once() {
  static const CURLcode kInit = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (kInit != CURLE_OK) {
    throw NetworkError(
        std::string("libcurl failed to initialise: ") +
        curl_easy_strerror(kInit));
  }
}

struct CurlDeleter {
  void operator()(CURL* curl) const {
    curl_easy_cleanup(curl);
  }
  void operator()(curl_slist* list) const {
    curl_slist_free_all(list);
  }
};

using CurlPtr = std::unique_ptr<CURL, CurlDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, CurlDeleter>;

template <typename T>
void set_option(CURL* curl, CURLoption option, T value) {
  CURLcode rc = curl_easy_setopt(curl, option, value);
  if (rc != CURLE_OK) {
    throw InternalError(
        std::string("curl_easy_setopt failed: ") + curl_easy_strerror(rc));
  }
}

long response_code(CURL* curl) {
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  return status;
}

// Points c at a POST of payload to url, its reply going to write(data),
// the whole transfer bounded by timeout.
void set_post(
    CURL* c,
    const std::string& url,
    const std::string& payload,
    size_t (*write)(char*, size_t, size_t, void*),
    void* data,
    std::chrono::milliseconds timeout) {
  set_option(c, CURLOPT_URL, url.c_str());
  set_option(c, CURLOPT_POSTFIELDS, payload.data());
  set_option(
      c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(payload.size()));
  set_option(c, CURLOPT_WRITEFUNCTION, write);
  set_option(c, CURLOPT_WRITEDATA, data);
  // 0 would mean no timeout at all.
  set_option(
      c,
      CURLOPT_TIMEOUT_MS,
      static_cast<long>(std::max<int64_t>(timeout.count(), 1)));
}

size_t append_to_string(char* data, size_t size, size_t count, void* user) {
  try {
    static_cast<std::string*>(user)->append(data, size * count);
    return size * count;
  } catch (...) {
    return 0;  // curl fails the transfer with CURLE_WRITE_ERROR
  }
}

std::vector<std::string> parse_endpoints(const std::string& endpoints) {
  std::vector<std::string> out;
  for (std::string_view piece : split(endpoints, ',')) {
    while (!piece.empty() && piece.front() == ' ') {
      piece.remove_prefix(1);
    }
    while (!piece.empty() && (piece.back() == ' ' || piece.back() == '/')) {
      piece.remove_suffix(1);
    }
    if (piece.empty()) {
      continue;
    }
    std::string url(piece);
    if (url.find("://") == std::string::npos) {
      url = "http://" + url;
    }
    out.push_back(std::move(url));
  }
  if (out.empty()) {
    throw InvalidArgument(
        "etcd endpoints \"" + endpoints +
        "\": expected host:port[,host:port...]");
  }
  return out;
}

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

// The kind of attempt failure that moves a call to the next endpoint.
struct Failure {
  std::string endpoint;
  std::string reason;
};

std::string describe_failures(const std::vector<Failure>& failures) {
  std::string out;
  for (const auto& f : failures) {
    out += (out.empty() ? "" : "; ") + f.endpoint + ": " + f.reason;
  }
  return out;
}

// The state of one watch stream, fed by curl's write callback. The gateway
// sends one JSON object per line: {"result":{"created":true,...}} first,
// then one per batch of events; {"error":{...}} when the stream breaks.
struct WatchStream {
  CURL* curl = nullptr;
  std::string context;
  std::string buffer;
  size_t scanned = 0;  // buffer[0, scanned) holds no newline
  bool created = false;
  int64_t created_revision = 0;
  bool event = false;
  std::string stream_error;  // an {"error":...} line
  std::exception_ptr error;  // thrown at the caller after perform
  long status = 0;

  // Returns false to stop the transfer.
  bool feed(const char* data, size_t len) {
    if (status == 0) {
      status = response_code(curl);
    }
    buffer.append(data, len);
    if (status != 200) {
      return true;  // an error body: read whole, parsed by the caller
    }
    for (;;) {
      size_t nl = buffer.find('\n', scanned);
      if (nl == std::string::npos) {
        scanned = buffer.size();
        return true;
      }
      std::string_view line(buffer.data(), nl);
      bool go_on = line.find_first_not_of(" \r\t") == std::string_view::npos
                       ? true
                       : on_message(line);
      buffer.erase(0, nl + 1);
      scanned = 0;
      if (!go_on) {
        return false;
      }
    }
  }

  bool on_message(std::string_view line) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      bad_reply(
          context, "a watch message is not JSON: " + printable(line, 200));
    }
    if (const json* e = find_field(j, "error")) {
      stream_error = printable(e->dump(), 300);
      return false;
    }
    const json& result = object_field(j, "result", context);
    if (bool_field(result, "created", context)) {
      created = true;
      created_revision = header_revision(result, context);
    }
    if (bool_field(result, "canceled", context)) {
      if (int_field(result, "compact_revision", context) > 0) {
        // The revision asked for is compacted: events may be gone.
        event = true;
        return false;
      }
      throw RemoteError(
          context + ": etcd canceled the watch: " +
          text_field(result, "cancel_reason", context));
    }
    if (!array_field(result, "events", context).empty()) {
      event = true;
      return false;
    }
    return true;
  }
};

size_t feed_watch(char* data, size_t size, size_t count, void* user) {
  auto* stream = static_cast<WatchStream*>(user);
  try {
    return stream->feed(data, size * count) ? size * count : 0;
  } catch (...) {
    stream->error = std::current_exception();
    return 0;
  }
}

}  // namespace

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

// --- the client ------------------------------------------------------------

struct EtcdClient::Impl {
  Impl(const std::string& endpoint_list, milliseconds timeout)
      : endpoints(parse_endpoints(endpoint_list)), request_timeout(timeout) {
    init_curl_once();
    curl_slist* list =
        curl_slist_append(nullptr, "Content-Type: application/json");
    // No "Expect: 100-continue" round trip before large bodies.
    list = curl_slist_append(list, "Expect:");
    headers.reset(list);
    request = make_handle();
    watcher = make_handle();
  }

  CurlPtr make_handle() {
    CurlPtr h(curl_easy_init());
    if (!h || !headers) {
      throw NetworkError("libcurl could not create a handle (out of memory)");
    }
    CURL* c = h.get();
    // Timeouts without SIGALRM: safe with threads.
    set_option(c, CURLOPT_NOSIGNAL, 1L);
    set_option(c, CURLOPT_POST, 1L);
    set_option(c, CURLOPT_HTTPHEADER, headers.get());
    set_option(c, CURLOPT_ERRORBUFFER, error_buffer);
    // etcd is reached directly; an http_proxy meant for the web must not
    // capture cluster traffic.
    set_option(c, CURLOPT_NOPROXY, "*");
    set_option(c, CURLOPT_TCP_NODELAY, 1L);
    return h;
  }

  std::string curl_error(CURLcode rc) const {
    std::string detail = error_buffer;
    return detail.empty() ? curl_easy_strerror(rc) : detail;
  }

  // POSTs body to path, failing over across the endpoints. Returns the JSON
  // object of the first answer that is not 5xx, with `context` set for
  // messages; throws for an error answer, unless its gRPC code is
  // `accepted_error` (then that answer is returned).
  json call(
      const std::string& what,
      const char* path,
      const json& body,
      std::string& context,
      int64_t accepted_error = -1) {
    std::string payload = body.dump();
    std::vector<Failure> failures;
    CURL* c = request.get();
    for (size_t attempt = 0; attempt < endpoints.size(); ++attempt) {
      size_t index = (current + attempt) % endpoints.size();
      const std::string& endpoint = endpoints[index];
      std::string url = endpoint + path;
      response.clear();
      error_buffer[0] = '\0';
      set_post(c, url, payload, &append_to_string, &response, request_timeout);
      CURLcode rc = curl_easy_perform(c);
      if (rc != CURLE_OK) {
        failures.push_back({endpoint, curl_error(rc)});
        TIDE_LOG_DEBUG(
            "etcd: {} at {} failed: {}",
            what,
            endpoint,
            failures.back().reason);
        continue;
      }
      long status = response_code(c);
      context = what + " at " + endpoint;
      json reply = json::parse(response, nullptr, /*allow_exceptions=*/false);
      if (status >= 500) {
        std::string why = "HTTP " + std::to_string(status);
        if (reply.is_object()) {
          why += " " + etcd_error_text(reply);
        }
        failures.push_back({endpoint, why});
        TIDE_LOG_DEBUG("etcd: {} at {} failed: {}", what, endpoint, why);
        continue;
      }
      current = index;
      if (reply.is_discarded() || !reply.is_object()) {
        bad_reply(
            context,
            "HTTP " + std::to_string(status) +
                " with a body that is not a JSON object: \"" +
                printable(response, 200) + "\"");
      }
      if (status != 200 && error_code(reply) != accepted_error) {
        throw_error_reply(context, status, reply);
      }
      return reply;
    }
    throw NetworkError(
        what + ": no etcd endpoint answered (" + describe_failures(failures) +
        "); check that etcd is running at " + endpoint_list() +
        " and has a quorum");
  }

  // The gRPC code of an error answer, or -1.
  static int64_t error_code(const json& reply) {
    const json* code = find_field(reply, "code");
    return code != nullptr && code->is_number_integer() ? code->get<int64_t>()
                                                        : -1;
  }

  [[noreturn]] static void throw_error_reply(
      const std::string& context, long status, const json& reply) {
    std::string text = etcd_error_text(reply);
    if (text.empty()) {
      text = printable(reply.dump(), 200);
    }
    std::string msg = context + ": etcd answered HTTP " +
                      std::to_string(status) + ": " + text;
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

  std::string endpoint_list() const {
    std::string out;
    for (const auto& e : endpoints) {
      out += (out.empty() ? "" : ",") + e;
    }
    return out;
  }

  bool watch(
      const std::string& what,
      const json& create,
      int64_t start_revision,
      milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    std::vector<Failure> failures;
    CURL* c = watcher.get();
    json request = json::object();
    request["create_request"] = create;
    for (size_t attempt = 0; attempt < endpoints.size(); ++attempt) {
      auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        return false;
      }
      if (start_revision > 0) {
        request["create_request"]["start_revision"] =
            std::to_string(start_revision);
      }
      std::string payload = request.dump();
      size_t index = (current + attempt) % endpoints.size();
      const std::string& endpoint = endpoints[index];
      std::string url = endpoint + "/v3/watch";
      WatchStream stream;
      stream.curl = c;
      stream.context = what + " at " + endpoint;
      error_buffer[0] = '\0';
      set_post(c, url, payload, &feed_watch, &stream, left);
      CURLcode rc = curl_easy_perform(c);
      // Nothing below may leave `stream` referenced by the handle.
      set_option(c, CURLOPT_WRITEDATA, static_cast<void*>(nullptr));
      if (stream.error) {
        std::rethrow_exception(stream.error);
      }
      if (stream.event) {
        current = index;
        return true;
      }
      if (stream.created && start_revision == 0) {
        // Resume where this stream began, should it have to move.
        start_revision = stream.created_revision + 1;
      }
      if (rc == CURLE_OPERATION_TIMEDOUT) {
        // Quiet until the deadline (or the endpoint hung: no time is left to
        // try another).
        if (stream.created) {
          current = index;
        }
        return false;
      }
      long status = response_code(c);
      if (rc == CURLE_OK && status != 200 && status < 500) {
        json reply = json::parse(stream.buffer, nullptr, false);
        current = index;
        if (reply.is_discarded() || !reply.is_object()) {
          bad_reply(
              stream.context,
              "HTTP " + std::to_string(status) +
                  " with a body that is not a JSON object: \"" +
                  printable(stream.buffer, 200) + "\"");
        }
        throw_error_reply(stream.context, status, reply);
      }
      std::string why;
      if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR) {
        why = curl_error(rc);
      } else if (!stream.stream_error.empty()) {
        why = "the watch stream broke: " + stream.stream_error;
      } else if (status != 200) {
        why = "HTTP " + std::to_string(status) + " " +
              printable(stream.buffer, 200);
      } else {
        why = "the watch stream ended";
      }
      failures.push_back({endpoint, why});
      TIDE_LOG_DEBUG("etcd: {} at {} failed: {}", what, endpoint, why);
    }
    throw NetworkError(
        what + ": no etcd endpoint answered (" + describe_failures(failures) +
        "); check that etcd is running at " + endpoint_list() +
        " and has a quorum");
  }

  const std::vector<std::string> endpoints;
  size_t current = 0;
  milliseconds request_timeout;
  SlistPtr headers;
  CurlPtr request;  // kept alive between calls
  CurlPtr watcher;  // its connection is dropped after each watch
  std::string response;
  char error_buffer[CURL_ERROR_SIZE] = {};
};

EtcdClient::EtcdClient(
    const std::string& endpoints, std::chrono::milliseconds request_timeout)
    : impl_(std::make_unique<Impl>(endpoints, request_timeout)) {}

EtcdClient::~EtcdClient() = default;

RangeResult EtcdClient::range(
    std::string_view key, const RangeOptions& options) {
  std::string context;
  json reply = impl_->call(
      describe("range", key),
      "/v3/kv/range",
      range_request(key, options),
      context);
  return parse_range(reply, context);
}

std::optional<KeyValue> EtcdClient::get(std::string_view key) {
  std::string context;
  json reply = impl_->call(
      describe("get", key), "/v3/kv/range", range_request(key, {}), context);
  RangeResult r = parse_range(reply, context);
  if (r.kvs.empty()) {
    return std::nullopt;
  }
  return std::move(r.kvs.front());
}

MultiGetResult EtcdClient::get_many(
    const std::vector<std::string>& keys, bool keys_only) {
  MultiGetResult out;
  out.kvs.reserve(keys.size());
  for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    size_t end = std::min(keys.size(), begin + kMaxTxnOps);
    json ops = json::array();
    for (size_t i = begin; i < end; ++i) {
      ops.push_back(op(
          "request_range", range_request(keys[i], {.keys_only = keys_only})));
    }
    json txn = json::object();
    txn["success"] = std::move(ops);
    std::string context;
    json reply = impl_->call(
        describe("get_many", keys[begin]), "/v3/kv/txn", txn, context);
    const json& responses = array_field(reply, "responses", context);
    if (responses.size() != end - begin) {
      bad_reply(
          context,
          std::to_string(responses.size()) + " responses to " +
              std::to_string(end - begin) + " reads");
    }
    for (const json& response : responses) {
      const json& range = object_field(response, "response_range", context);
      const json& kvs = array_field(range, "kvs", context);
      if (kvs.empty()) {
        out.kvs.emplace_back();
      } else {
        out.kvs.push_back(parse_kv(kvs[0], context));
      }
    }
    int64_t revision = header_revision(reply, context);
    out.revision = begin == 0 ? revision : std::min(out.revision, revision);
  }
  return out;
}

int64_t EtcdClient::put(
    std::string_view key, std::string_view value, int64_t lease) {
  std::string context;
  json reply = impl_->call(
      describe("put", key),
      "/v3/kv/put",
      put_request(key, value, lease),
      context);
  return header_revision(reply, context);
}

int64_t EtcdClient::increment(std::string_view key) {
  // A put always succeeds and bumps the key's version by one; the previous
  // version comes back with prev_kv. No compare-and-swap, so no retries
  // under contention.
  std::string context;
  json request = put_request(key, "", 0);
  request["prev_kv"] = true;
  json reply =
      impl_->call(describe("increment", key), "/v3/kv/put", request, context);
  auto prev = reply.find("prev_kv");
  if (prev == reply.end()) {
    return 1;
  }
  return parse_kv(*prev, context).version + 1;
}

int64_t EtcdClient::put_many(
    const std::vector<std::string>& keys,
    const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument(
        "put_many: " + std::to_string(keys.size()) + " keys but " +
        std::to_string(values.size()) + " values");
  }
  int64_t revision = 0;
  for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    size_t end = std::min(keys.size(), begin + kMaxTxnOps);
    json ops = json::array();
    for (size_t i = begin; i < end; ++i) {
      ops.push_back(op("request_put", put_request(keys[i], values[i], 0)));
    }
    json txn = json::object();
    txn["success"] = std::move(ops);
    std::string context;
    json reply = impl_->call(
        describe("put_many", keys[begin]), "/v3/kv/txn", txn, context);
    revision = header_revision(reply, context);
  }
  return revision;
}

TxnResult EtcdClient::put_if_mod_revision(
    std::string_view key,
    int64_t expected_mod_revision,
    std::string_view value,
    int64_t lease) {
  json compare = json::object();
  compare["key"] = base64_encode(key);
  compare["target"] = "MOD";
  compare["result"] = "EQUAL";
  compare["mod_revision"] = std::to_string(expected_mod_revision);
  std::string context;
  json reply = impl_->call(
      describe("put_if_mod_revision", key),
      "/v3/kv/txn",
      txn_put_else_range(std::move(compare), key, value, lease),
      context);
  return parse_txn(reply, "response_range", context);
}

TxnResult EtcdClient::put_if_value(
    std::string_view key, std::string_view expected, std::string_view value) {
  json compare = json::object();
  compare["key"] = base64_encode(key);
  compare["target"] = "VALUE";
  compare["result"] = "EQUAL";
  compare["value"] = base64_encode(expected);
  std::string context;
  json reply = impl_->call(
      describe("put_if_value", key),
      "/v3/kv/txn",
      txn_put_else_range(std::move(compare), key, value, 0),
      context);
  return parse_txn(reply, "response_range", context);
}

int64_t EtcdClient::delete_range(
    std::string_view key, const RangeOptions& options) {
  json request = json::object();
  request["key"] = base64_encode(key);
  std::string end = options.prefix ? prefix_range_end(key) : options.range_end;
  if (!end.empty()) {
    request["range_end"] = base64_encode(end);
  }
  std::string context;
  json reply = impl_->call(
      describe("delete_range", key), "/v3/kv/deleterange", request, context);
  return int_field(reply, "deleted", context);
}

int64_t EtcdClient::lease_grant(std::chrono::seconds ttl) {
  json request = json::object();
  request["TTL"] = std::to_string(ttl.count());
  std::string context;
  json reply = impl_->call("lease_grant", "/v3/lease/grant", request, context);
  // LeaseGrantResponse has an error field of its own.
  std::string error = text_field(reply, "error", context);
  if (!error.empty()) {
    throw RemoteError(context + ": etcd refused the lease: " + error);
  }
  int64_t id = int_field(reply, "ID", context);
  if (id == 0) {
    bad_reply(context, "a granted lease without an ID");
  }
  return id;
}

int64_t EtcdClient::lease_keepalive(int64_t lease) {
  json request = json::object();
  request["ID"] = std::to_string(lease);
  std::string context;
  // A stream of one message here: {"result":{...,"TTL":"5"}}, no TTL when
  // the lease is gone.
  json reply = impl_->call(
      "lease_keepalive of lease " + std::to_string(lease),
      "/v3/lease/keepalive",
      request,
      context);
  if (const json* e = find_field(reply, "error")) {
    throw RemoteError(context + ": etcd answered " + printable(e->dump(), 300));
  }
  return std::max<int64_t>(
      0, int_field(object_field(reply, "result", context), "TTL", context));
}

void EtcdClient::lease_revoke(int64_t lease) {
  json request = json::object();
  request["ID"] = std::to_string(lease);
  std::string context;
  // NotFound: already expired or revoked, which is what revoke wanted.
  constexpr int64_t kGrpcNotFound = 5;
  impl_->call(
      "lease_revoke of lease " + std::to_string(lease),
      "/v3/lease/revoke",
      request,
      context,
      kGrpcNotFound);
}

bool EtcdClient::watch(
    std::string_view key,
    int64_t start_revision,
    std::chrono::milliseconds timeout,
    bool prefix) {
  json create = json::object();
  create["key"] = base64_encode(key);
  if (prefix) {
    create["range_end"] = base64_encode(prefix_range_end(key));
  }
  return impl_->watch(describe("watch", key), create, start_revision, timeout);
}

std::string EtcdClient::current_endpoint() const {
  return impl_->endpoints[impl_->current];
}

void EtcdClient::set_request_timeout(std::chrono::milliseconds timeout) {
  impl_->request_timeout = timeout;
}

}  // namespace tide::etcd
