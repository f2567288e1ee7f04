#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// A small blocking client of etcd v3 through its HTTP/JSON gateway
// (grpc-gateway, POST /v3/...), enough for a store and a rendezvous: ranges,
// puts, two kinds of compare-and-swap, deletes, leases and a one-shot watch.
// It speaks JSON over libcurl; keys and values travel base64-encoded and
// int64 fields as decimal strings, as the gateway wants.
//
// Thread safety: none. A client owns one kept-alive connection; use one
// client per thread (or guard it).
//
// Failover: a call goes to the current endpoint. When that endpoint cannot be
// reached, times out or answers 5xx (no quorum, no leader), the call moves to
// the next endpoint and is sent again, each endpoint once per call; the
// endpoint that answered stays current. A call that timed out may still have
// happened, so a retried compare-and-swap can fail because of its own first
// attempt (the caller sees the kv it wrote as "current").
//
// Errors:
//   NetworkError     every endpoint failed (the message names each and why)
//   InvalidArgument  etcd refused the request itself (a value over
//                    --max-request-bytes, an empty key)
//   RemoteError      any other error etcd answered (a lease not found, the
//                    space quota); the message carries etcd's text and code
//   ProtocolError    a reply that is not the JSON etcd sends (bad base64, a
//                    field of the wrong type); not retried on another endpoint
// Every message names the call and the key.
namespace tide::etcd {

// One key as etcd stores it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  // Revision of the key's creation, of its last change, and the number of
  // changes since its creation.
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  // The lease the key is attached to, or 0.
  int64_t lease = 0;
};

struct RangeOptions {
  // End of the range [key, range_end) when not empty. "\0" means every key
  // from `key` on.
  std::string range_end;
  // Every key starting with `key` (range_end = key with its last byte + 1);
  // overrides range_end.
  bool prefix = false;
  // Only RangeResult::count, no kvs.
  bool count_only = false;
  // kvs without their values.
  bool keys_only = false;
  // At most this many kvs (0: all); count is still the total.
  int64_t limit = 0;
  // Only keys created at or before / at or after these revisions (0: any).
  int64_t max_create_revision = 0;
  int64_t min_create_revision = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  // Keys in the range (before limit).
  int64_t count = 0;
  // The store's revision when the range was read (header.revision).
  int64_t revision = 0;
};

struct TxnResult {
  bool succeeded = false;
  // The store's revision after the transaction.
  int64_t revision = 0;
  // On failure: the key's kv at that revision, or nullopt when it is absent.
  std::optional<KeyValue> current;
};

// The kvs of several keys (nullopt for an absent key), in the order asked.
struct MultiGetResult {
  std::vector<std::optional<KeyValue>> kvs;
  // The smallest revision any of them was read at: every absent key was
  // absent at some revision >= this one.
  int64_t revision = 0;
};

class EtcdClient {
 public:
  // etcd's default --max-txn-ops: the most operations one transaction holds.
  static constexpr size_t kMaxTxnOps = 128;

  // endpoints: "host:port[,host:port...]", each optionally with a scheme
  // ("http://host:port"); no scheme means http. request_timeout bounds each
  // attempt of every call except watch (a call that fails over can take one
  // request_timeout per endpoint). Connects lazily: nothing is sent here.
  // Throws InvalidArgument when endpoints is empty.
  EtcdClient(
      const std::string& endpoints, std::chrono::milliseconds request_timeout);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The kvs in a range (a single key with default options).
  RangeResult range(std::string_view key, const RangeOptions& options = {});

  // One key's kv, or nullopt when it is absent.
  std::optional<KeyValue> get(std::string_view key);

  // The kvs of keys, read in transactions of up to kMaxTxnOps keys each (so
  // one revision per kMaxTxnOps keys, not one for all). keys_only leaves the
  // values out.
  MultiGetResult get_many(
      const std::vector<std::string>& keys, bool keys_only = false);

  // Sets key to value (attached to lease when not 0); returns the revision
  // of the write.
  int64_t put(std::string_view key, std::string_view value, int64_t lease = 0);

  // Writes key and returns its version after the write: 1, 2, 3 ... for
  // successive calls, an atomic counter without contention. A call retried
  // on another endpoint after a timeout may have counted once already.
  int64_t increment(std::string_view key);
  // Sets keys[i] to values[i] in transactions of up to kMaxTxnOps puts;
  // returns the revision of the last one. The sizes must match
  // (InvalidArgument).
  int64_t put_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values);

  // Puts value when key's mod_revision equals expected_mod_revision (0: the
  // key must be absent). On failure returns the key's current kv.
  TxnResult put_if_mod_revision(
      std::string_view key,
      int64_t expected_mod_revision,
      std::string_view value,
      int64_t lease = 0);

  // Puts value when key exists and its value equals expected. On failure
  // returns the key's current kv (nullopt: absent).
  TxnResult put_if_value(
      std::string_view key, std::string_view expected, std::string_view value);

  // Deletes a range (a single key with default options; count_only,
  // keys_only and limit do not apply); returns how many keys it deleted.
  int64_t delete_range(std::string_view key, const RangeOptions& options = {});

  // Grants a lease of ttl (etcd raises TTLs under 2 s to 2 s); returns its
  // id.
  int64_t lease_grant(std::chrono::seconds ttl);

  // Refreshes a lease once; returns its remaining TTL in seconds, 0 when the
  // lease is gone (expired or revoked).
  int64_t lease_keepalive(int64_t lease);

  // Revokes a lease and deletes its keys. A lease that is already gone is
  // not an error.
  void lease_revoke(int64_t lease);

  // Blocks until an event (a put or delete) on key, or with prefix on any
  // key starting with key, at a revision >= start_revision (0: from now on),
  // or until timeout. Returns true when an event came, false on timeout.
  // When start_revision has been compacted away the events may be lost, so
  // that also returns true: the caller must re-read anyway. Watches over its
  // own connection; the stream moves to the next endpoint when its
  // endpoint fails, within the same timeout.
  bool watch(
      std::string_view key,
      int64_t start_revision,
      std::chrono::milliseconds timeout,
      bool prefix = false);

  // The endpoint calls go to now ("http://host:port").
  std::string current_endpoint() const;

  // The timeout of each attempt of later calls.
  void set_request_timeout(std::chrono::milliseconds timeout);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Base64 (RFC 4648, with padding), as the gateway encodes bytes.
std::string base64_encode(std::string_view bytes);
// Throws ProtocolError on anything but canonical padded base64.
std::string base64_decode(std::string_view text);

// The end of the range holding every key that starts with prefix: prefix
// with its last byte below 0xff incremented and what follows dropped; "\0"
// (every key) when there is no such byte.
std::string prefix_range_end(std::string_view prefix);

}  // namespace tide::etcd
