// HTTP to etcd over libcurl: calls and watch streams, failing over across
// the endpoints.
#include "etcd/http.h"

#include <algorithm>
#include <exception>
#include <string_view>
#include <thread>
#include <utility>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "etcd/codec.h"

namespace tide::etcd {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a call waits for a cluster without a leader to elect one.
constexpr milliseconds kElectionWait{5000};

// --- libcurl ---------------------------------------------------------------

void init_curl_once() {
  static const CURLcode kInit = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (kInit != CURLE_OK) {
    throw NetworkError(
        std::string("libcurl failed to initialise: ") +
        curl_easy_strerror(kInit));
  }
}

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

EtcdHttp::EtcdHttp(const std::string& endpoints, milliseconds request_timeout)
    : endpoints_(parse_endpoints(endpoints)),
      request_timeout_(request_timeout) {
  init_curl_once();
  curl_slist* list =
      curl_slist_append(nullptr, "Content-Type: application/json");
  // No "Expect: 100-continue" round trip before large bodies.
  list = curl_slist_append(list, "Expect:");
  headers_.reset(list);
  request_ = make_handle();
  watcher_ = make_handle();
}

EtcdHttp::~EtcdHttp() = default;

EtcdHttp::CurlPtr EtcdHttp::make_handle() {
  CurlPtr h(curl_easy_init());
  if (!h || !headers_) {
    throw NetworkError("libcurl could not create a handle (out of memory)");
  }
  CURL* c = h.get();
  // Timeouts without SIGALRM: safe with threads.
  set_option(c, CURLOPT_NOSIGNAL, 1L);
  set_option(c, CURLOPT_POST, 1L);
  set_option(c, CURLOPT_HTTPHEADER, headers_.get());
  set_option(c, CURLOPT_ERRORBUFFER, error_buffer_);
  // etcd is reached directly; an http_proxy meant for the web must not
  // capture cluster traffic.
  set_option(c, CURLOPT_NOPROXY, "*");
  set_option(c, CURLOPT_TCP_NODELAY, 1L);
  return h;
}

std::string EtcdHttp::curl_error(CURLcode rc) const {
  std::string detail = error_buffer_;
  return detail.empty() ? curl_easy_strerror(rc) : detail;
}

json EtcdHttp::call(
    const std::string& what,
    const char* path,
    const json& body,
    std::string& context,
    int64_t accepted_error) {
  std::string payload = body.dump();
  std::vector<Failure> failures;
  CURL* c = request_.get();
  // A member that answers 5xx is up but has no leader ("leader changed",
  // "no leader"): the cluster is electing one, which takes a few election
  // timeouts (1 s each by default). Every member is tried again, with a
  // growing pause, until one answers or kElectionWait has passed; members
  // that cannot be reached at all fail the call at once.
  auto give_up = Clock::now() + std::min(request_timeout_, kElectionWait);
  milliseconds pause{50};
  for (;;) {
    failures.clear();
    bool electing = false;
    for (size_t attempt = 0; attempt < endpoints_.size(); ++attempt) {
      size_t index = (current_ + attempt) % endpoints_.size();
      const std::string& endpoint = endpoints_[index];
      std::string url = endpoint + path;
      response_.clear();
      error_buffer_[0] = '\0';
      set_post(
          c, url, payload, &append_to_string, &response_, request_timeout_);
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
      json reply = json::parse(response_, nullptr, /*allow_exceptions=*/false);
      if (status >= 500) {
        std::string why = "HTTP " + std::to_string(status);
        if (reply.is_object()) {
          why += " " + etcd_error_text(reply);
        }
        failures.push_back({endpoint, why});
        electing = true;
        TIDE_LOG_DEBUG("etcd: {} at {} failed: {}", what, endpoint, why);
        continue;
      }
      current_ = index;
      if (reply.is_discarded() || !reply.is_object()) {
        bad_reply(
            context,
            "HTTP " + std::to_string(status) +
                " with a body that is not a JSON object: \"" +
                printable(response_, 200) + "\"");
      }
      if (status != 200 && error_code(reply) != accepted_error) {
        throw_error_reply(context, status, reply);
      }
      return reply;
    }
    if (!electing || Clock::now() + pause > give_up) {
      break;
    }
    TIDE_LOG_DEBUG(
        "etcd: {}: no member has a leader; trying again in {} ms",
        what,
        pause.count());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(500));
  }
  throw NetworkError(
      what + ": no etcd endpoint answered (" + describe_failures(failures) +
      "); check that etcd is running at " + endpoint_list() +
      " and has a quorum");
}

bool EtcdHttp::watch(
    const std::string& what,
    const json& create,
    int64_t start_revision,
    milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::vector<Failure> failures;
  CURL* c = watcher_.get();
  json request = json::object();
  request["create_request"] = create;
  for (size_t attempt = 0; attempt < endpoints_.size(); ++attempt) {
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
    size_t index = (current_ + attempt) % endpoints_.size();
    const std::string& endpoint = endpoints_[index];
    std::string url = endpoint + "/v3/watch";
    WatchStream stream;
    stream.curl = c;
    stream.context = what + " at " + endpoint;
    error_buffer_[0] = '\0';
    set_post(c, url, payload, &feed_watch, &stream, left);
    CURLcode rc = curl_easy_perform(c);
    // Nothing below may leave `stream` referenced by the handle.
    set_option(c, CURLOPT_WRITEDATA, static_cast<void*>(nullptr));
    if (stream.error) {
      std::rethrow_exception(stream.error);
    }
    if (stream.event) {
      current_ = index;
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
        current_ = index;
      }
      return false;
    }
    long status = response_code(c);
    if (rc == CURLE_OK && status != 200 && status < 500) {
      json reply = json::parse(stream.buffer, nullptr, false);
      current_ = index;
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

std::string EtcdHttp::endpoint_list() const {
  std::string out;
  for (const auto& e : endpoints_) {
    out += (out.empty() ? "" : ",") + e;
  }
  return out;
}

std::string EtcdHttp::current_endpoint() const {
  return endpoints_[current_];
}

void EtcdHttp::set_request_timeout(milliseconds timeout) {
  request_timeout_ = timeout;
}

}  // namespace tide::etcd
