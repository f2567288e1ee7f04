// HTTP to etcd's v3 gateway over libcurl, with failover across the
// endpoints: JSON calls over one kept-alive handle, and watch streams over a
// second one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <curl/curl.h>
#include <nlohmann/json.hpp>

namespace tide::etcd {

// Not thread-safe: one EtcdHttp per thread (or guard it). Failover is as
// etcd/etcd_client.h describes it: each endpoint once per call, from the
// current one on; the endpoint that answered stays current.
class EtcdHttp {
 public:
  // endpoints: "host:port[,host:port...]", each optionally with a scheme.
  // Throws InvalidArgument when endpoints is empty.
  EtcdHttp(
      const std::string& endpoints, std::chrono::milliseconds request_timeout);
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  // POSTs body to path, failing over across the endpoints. Returns the JSON
  // object of the first answer that is not 5xx, with `context` set for
  // messages; throws for an error answer, unless its gRPC code is
  // `accepted_error` (then that answer is returned). While members answer
  // 5xx (a leader election) it tries them all again for up to 5 s;
  // NetworkError once none answers.
  nlohmann::json call(
      const std::string& what,
      const char* path,
      const nlohmann::json& body,
      std::string& context,
      int64_t accepted_error = -1);

  // Watches with the WatchCreateRequest `create` from start_revision (0:
  // from now on) until an event (true) or timeout (false), moving to the
  // next endpoint when the stream's endpoint fails.
  bool watch(
      const std::string& what,
      const nlohmann::json& create,
      int64_t start_revision,
      std::chrono::milliseconds timeout);

  // "http://a:2379,http://b:2379", for messages.
  std::string endpoint_list() const;

  // The endpoint calls go to now.
  std::string current_endpoint() const;

  // The timeout of each attempt of later calls.
  void set_request_timeout(std::chrono::milliseconds timeout);

 private:
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

  CurlPtr make_handle();
  std::string curl_error(CURLcode rc) const;

  const std::vector<std::string> endpoints_;
  size_t current_ = 0;
  std::chrono::milliseconds request_timeout_;
  SlistPtr headers_;
  CurlPtr request_;  // kept alive between calls
  CurlPtr watcher_;  // its connection is dropped after each watch
  std::string response_;
  char error_buffer_[CURL_ERROR_SIZE] = {};
};

}  // namespace tide::etcd
