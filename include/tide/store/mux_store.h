#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tide/store/store.h"

namespace tide::store {

namespace detail {
class MuxConnection;
}

struct MuxStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // Sent before anything else when not empty; must match the server's.
  std::string token;
  // Default timeout of blocking calls, and of connecting (retried with
  // backoff until then: the server may start after its clients).
  milliseconds timeout = Store::kDefaultTimeout;
};

// A Store client whose one connection many threads share at once: their
// requests are in flight together, each reply is found by its tag, and a
// wait holds up no other caller (tide's tagged frames,
// docs/store-protocol.md). It needs a tide server; a torch server closes
// the connection at the first frame, and the constructor says so.
//
// Keys get torch's "/" in front, as TcpStore's do, so the two see the same
// keys. Handles made by with_timeout() share the connection with their own
// default timeout (an agent's keep-alive gives up sooner than its
// rendezvous). A call with no reply within its timeout throws TimeoutError;
// if the server sent nothing at all in that time, the connection is taken
// for dead: it is dropped, the calls in flight on it fail with
// NetworkError, and the next call reconnects. A server that is only slow
// keeps the connection for the others.
//
// Thread safety: every call, from any number of threads at once.
class MuxStore final : public Store {
 public:
  // Connects; throws TimeoutError when the server cannot be reached within
  // timeout, NetworkError when it refuses the token or is not tide's.
  explicit MuxStore(MuxStoreOptions options);
  ~MuxStore() override;

  // Another handle on this connection whose default timeout is `timeout`.
  std::shared_ptr<MuxStore> with_timeout(milliseconds timeout) const;

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
  void ping();

  // Calls sent in one write and answered together: one packet each way for
  // a caller that needs them all at once (an agent's keep-alive). Add the
  // calls, run(), then read each result by the index its call returned.
  class Batch {
   public:
    size_t add(std::string_view key, int64_t delta);
    size_t compare_set(
        std::string_view key,
        std::string_view expected,
        std::string_view desired);
    // Sends them all and waits for every reply within the handle's timeout;
    // throws as the single calls do.
    void run();
    // An add's result.
    int64_t number(size_t i) const {
      return results_.at(i).number;
    }
    // A compare_set's result.
    const std::string& value(size_t i) const {
      return results_.at(i).value;
    }

   private:
    friend class MuxStore;
    struct Call {
      bool add = false;
      std::string key;
      int64_t delta = 0;
      std::string expected;
      std::string desired;
    };
    struct Result {
      int64_t number = 0;
      std::string value;
    };
    explicit Batch(const MuxStore& store) : store_(store) {}
    const MuxStore& store_;
    std::vector<Call> calls_;
    std::vector<Result> results_;
  };
  Batch batch() const {
    return Batch(*this);
  }

  // A wait that holds no thread: `done` is called once, on the connection's
  // reader thread, with kMet once every key is set, kTimedOut when `bound`
  // passed first, or kFailed when the connection was lost; it must not call
  // into this store. Nothing cancels it but its bound. Throws, as the
  // single calls do, when the request cannot be sent.
  enum class WaitEnd { kMet, kTimedOut, kFailed };
  void wait_async(
      const std::vector<std::string>& keys,
      milliseconds bound,
      std::function<void(WaitEnd)> done);

  // The shared connection (for the store fan-in).
  const std::shared_ptr<detail::MuxConnection>& connection() const {
    return conn_;
  }

 protected:
  void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) override;

 private:
  MuxStore(std::shared_ptr<detail::MuxConnection> conn, milliseconds timeout);

  std::shared_ptr<detail::MuxConnection> conn_;
};

}  // namespace tide::store
