#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tide/common/fd.h"
#include "tide/store/store.h"

#include "store/wire.h"

// One connection to a tide store that many callers share at once: each
// request goes out in a tagged frame (docs/store-protocol.md), a reader
// thread hands each reply to the callback its tag names, and a WAIT holds
// up nobody else. MuxStore (the Store API) and the store fan-in (which
// forwards a node's workers) are built on it.
namespace tide::store::detail {

struct MuxEndpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;
  // Connecting retries with backoff until this passes (the server may
  // start after its clients).
  milliseconds connect_timeout{30'000};
};

// Connects to endpoint and opens the tagged protocol (AUTH when there is a
// token, VALIDATE, a tagged PING), retrying with backoff until `deadline`
// when `retry`, else trying once. Returns the non-blocking socket; throws
// TimeoutError, or NetworkError (refused token, a store that is not tide's,
// a lost store that cannot be reached again).
Fd connect_tagged(
    const MuxEndpoint& endpoint, Clock::time_point deadline, bool retry);

class MuxConnection {
 public:
  // Called once per request with a reply: with error null and the reply,
  // or with the error (the connection failed or closed before it came).
  // On the reader thread, or on the submitting thread when the send fails.
  using Done = std::function<void(std::exception_ptr error, wire::Reply&)>;

  explicit MuxConnection(MuxEndpoint endpoint);
  // Closes; whatever is in flight is failed with NetworkError.
  ~MuxConnection();
  MuxConnection(const MuxConnection&) = delete;
  MuxConnection& operator=(const MuxConnection&) = delete;

  // Connects now, retrying with backoff until the endpoint's
  // connect_timeout (the server may start after its clients); throws
  // TimeoutError or NetworkError.
  void connect();

  // Sends req (its keys as given) in a tagged frame; a WAIT ends after
  // wait_ms (0: no bound) with kWaitTimedOut. When the connection was lost,
  // makes one attempt to reconnect first, bounded by `deadline` (a lost
  // server fails its callers at once rather than after a backoff). `done`
  // is called once when the request has a reply (wire::has_reply); never
  // for one without. Throws (without calling done) when no connection can
  // be made or the send fails.
  void submit(
      const wire::Request& req,
      uint64_t wait_ms,
      Done done,
      Clock::time_point deadline);

  // Several requests in one write (one packet where they fit), each as
  // submit() sends it; all go or, when the send fails, none has its done
  // called.
  struct Submission {
    const wire::Request& req;
    uint64_t wait_ms = 0;
    Done done;
  };
  void submit_all(std::vector<Submission> all, Clock::time_point deadline);

  // Fails everything in flight with `why` and closes; the next submit
  // opens a new connection.
  void reset(const std::string& why);

  // Requests in flight.
  size_t pending() const;
  // When bytes last came from the server (or the connection opened).
  Clock::time_point last_heard() const {
    return Clock::time_point(Clock::duration(last_heard_.load()));
  }
  // host:port
  const std::string& where() const {
    return where_;
  }

 private:
  struct Pending {
    wire::Request req;  // keys kept for MULTI_GET's reply
    Done done;
  };

  void open_locked(
      std::unique_lock<std::mutex>& lock,
      Clock::time_point deadline,
      bool retry);
  void read_loop(std::shared_ptr<Fd> fd, uint64_t generation);
  // Takes the pending requests of `generation` and fails them, unless a
  // newer connection replaced it.
  void fail(uint64_t generation, const std::string& why);

  const MuxEndpoint endpoint_;
  const std::string where_;

  mutable std::mutex mutex_;
  // The open connection (null when none): shared with its reader, so that
  // the descriptor is closed by whoever lets go of it last, never while
  // another thread may still use its number.
  std::shared_ptr<Fd> fd_;                         // guarded by mutex_
  uint64_t generation_ = 0;                        // of fd_, guarded by mutex_
  uint64_t next_tag_ = 1;                          // guarded by mutex_
  std::unordered_map<uint64_t, Pending> pending_;  // guarded by mutex_
  std::thread reader_;                             // guarded by mutex_
  bool closing_ = false;                           // guarded by mutex_
  std::mutex write_mutex_;  // one frame at a time on the socket
  std::atomic<Clock::rep> last_heard_{0};
};

}  // namespace tide::store::detail
