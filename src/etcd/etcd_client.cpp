// The etcd client: each call builds its request (etcd/codec.h), sends it
// with failover (etcd/http.h) and reads the reply.
#include "etcd/etcd_client.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"

#include "etcd/codec.h"
#include "etcd/http.h"

namespace tide::etcd {

struct EtcdClient::Impl {
  Impl(const std::string& endpoints, std::chrono::milliseconds timeout)
      : http(endpoints, timeout) {}

  EtcdHttp http;
};

EtcdClient::EtcdClient(
    const std::string& endpoints, std::chrono::milliseconds request_timeout)
    : impl_(std::make_unique<Impl>(endpoints, request_timeout)) {}

EtcdClient::~EtcdClient() = default;

RangeResult EtcdClient::range(
    std::string_view key, const RangeOptions& options) {
  std::string context;
  json reply = impl_->http.call(
      describe("range", key),
      "/v3/kv/range",
      range_request(key, options),
      context);
  return parse_range(reply, context);
}

std::optional<KeyValue> EtcdClient::get(std::string_view key) {
  std::string context;
  json reply = impl_->http.call(
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
    json reply = impl_->http.call(
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
  json reply = impl_->http.call(
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
  json reply = impl_->http.call(
      describe("increment", key), "/v3/kv/put", request, context);
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
    json reply = impl_->http.call(
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
  json reply = impl_->http.call(
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
  json reply = impl_->http.call(
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
  json reply = impl_->http.call(
      describe("delete_range", key), "/v3/kv/deleterange", request, context);
  return int_field(reply, "deleted", context);
}

int64_t EtcdClient::lease_grant(std::chrono::seconds ttl) {
  json request = json::object();
  request["TTL"] = std::to_string(ttl.count());
  std::string context;
  json reply =
      impl_->http.call("lease_grant", "/v3/lease/grant", request, context);
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
  json reply = impl_->http.call(
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
  impl_->http.call(
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
  return impl_->http.watch(
      describe("watch", key), create, start_revision, timeout);
}

std::string EtcdClient::current_endpoint() const {
  return impl_->http.current_endpoint();
}

void EtcdClient::set_request_timeout(std::chrono::milliseconds timeout) {
  impl_->http.set_request_timeout(timeout);
}

}  // namespace tide::etcd
