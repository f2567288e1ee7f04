#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tide/store/store.h"

namespace tide::etcd {

using std::chrono::milliseconds;

// A Store kept in etcd (torch's EtcdStore), for jobs whose rendezvous lives
// there: it survives the loss of any one machine, including the one that
// would host a TCP store. Every key lives under a prefix given at
// construction, so one etcd serves many jobs; "/tide/job1" becomes
// "/tide/job1/" (a '/' is added unless the prefix ends with one) and key "k"
// is stored as "/tide/job1/k". Values are stored as they are; add() keeps
// decimal text, as every tide and torch store does.
//
// etcd limits a request to --max-request-bytes (1.5 MiB by default): a
// larger value throws InvalidArgument. num_keys() counts the keys under the
// prefix only.
//
// Waiting (get, wait, multi_get) reads the keys and then watches the first
// missing one from the revision read, so a key set in between is never
// missed and nothing polls.
//
// Thread safety: every call is thread safe, and calls from several threads
// run in parallel: each takes a connection from a small pool (one opened
// when all are busy), so a waiting get() never holds up another thread.
// Blocking: besides waiting, a call may take one attempt per member, each
// bounded by timeout() and at most 30 s, before it gives up.
// Errors: TimeoutError (get/wait/multi_get, naming the missing keys),
// NetworkError (no etcd member answered),
// InvalidArgument (add() on text, a value etcd refuses), RemoteError (an
// error etcd answered), ProtocolError (a reply etcd would not send).
class EtcdStore final : public store::Store {
 public:
  // endpoints: "host:port[,host:port...]" of the etcd cluster's client
  // URLs, each optionally with "http://". A call that cannot reach one
  // member goes on to the next. Connects on the first call; throws
  // InvalidArgument for an empty endpoint list.
  EtcdStore(
      const std::string& endpoints,
      std::string key_prefix,
      milliseconds timeout = store::Store::kDefaultTimeout);
  ~EtcdStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override;

  // The prefix every key is stored under, ending in '/'.
  const std::string& key_prefix() const {
    return prefix_;
  }

  class ClientPool;

 protected:
  void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) override;

 private:
  std::string full(std::string_view key) const;
  std::vector<std::string> full(const std::vector<std::string>& keys) const;
  // The values of keys (empty strings with keys_only) once all exist,
  // waiting at most timeout.
  std::vector<std::string> read_when_present(
      const std::vector<std::string>& keys,
      milliseconds timeout,
      std::string_view what,
      bool keys_only);

  const std::string prefix_;
  const std::unique_ptr<ClientPool> clients_;
};

}  // namespace tide::etcd
