#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tide/common/future.h"
#include "tide/rpc/rpc.h"

#include "common/clock.h"
#include "rpc/calls.h"

// The books of RRefs one agent keeps (torch's RRefContext), and the
// protocol between agents (docs/rpc.md#rrefs):
//
//   remote()           tide.rref.create(id, fork, fn) + fn's arguments to
//                      the owner, which registers the caller's fork and
//                      keeps what fn returns as the value
//   to_here()          tide.rref.fetch(id) to the owner; a fetch that
//                      overtakes the creation waits for it
//   proxies            tide.rref.invoke(id, type, method) + the arguments
//   passing an RRef    the sender mints a fork id. An owner registers the
//                      fork at once (its holder is the message's receiver);
//                      a user keeps its own RRef as the parent until the
//                      child accepts. The receiver: the owner itself sends
//                      tide.rref.accept(fork) to the parent; a user sends
//                      tide.rref.fork(id, fork) to the owner, and on its
//                      acknowledgement tide.rref.accept(fork) to the parent
//   dropping an RRef   a user's last copy gone: tide.rref.delete(id, fork)
//
// Control messages (fork, accept, delete) are idempotent on the receiver
// and retried with back-off; functions never are. A lost peer (a closed
// connection, either way) fails every RRef it owns, and its forks are
// dropped from the values this worker owns.
namespace tide::rpc::detail {

class RRefBooks;

// The function remote() calls on the owner, and what its payload starts
// with (after the autograd context): the RRef, the caller's fork, and the
// function whose result the RRef holds, whose arguments follow.
inline constexpr std::string_view kCreate = "tide.rref.create";
struct Creation {
  RRefId id;
  RRefId fork;
  std::string fn;
};
Creation read_creation(Decoder& d);

// The confirmations the RRefs in a request's arguments wait for (a user's
// fork the owner has not acknowledged yet): the function runs after them.
// Decoding the arguments fills it, through the message's context.
class ArgumentWaits {
 public:
  void add(Future<void> confirmed) {
    waits_.push_back(std::move(confirmed));
  }
  std::vector<Future<void>> take() {
    return std::move(waits_);
  }

 private:
  std::vector<Future<void>> waits_;
};

// The owner's record of one RRef: its value, once made, and the forks
// users hold. In the books while a fork is known or a remote() to this
// worker runs; every owner RRefNode holds it too.
struct OwnerEntry {
  explicit OwnerEntry(RRefId i) : id(i), value(promise.get_future()) {}

  const RRefId id;
  Promise<Value> promise;
  const Future<Value> value;
  // Guarded by the books' mutex.
  std::map<RRefId, int> forks;  // fork -> the worker holding it
  bool creating = false;        // remote() to this worker, unanswered
  int local_handles = 0;        // owner RRefNodes alive here
};

struct RRefNode {
  ~RRefNode();

  std::shared_ptr<RRefBooks> books;
  RRefId id;
  int owner = -1;
  std::string type;  // the T of RRef<T>
  // On the owner (RRefBooks::own() sets it).
  std::shared_ptr<OwnerEntry> entry;
  // A user's fork, and when the owner knows of it.
  RRefId fork;
  Promise<void> confirmation;
  Future<void> confirmed = confirmation.get_future();
  // Guarded by the books' mutex.
  std::exception_ptr error;  // creation failed, or the owner was lost
  bool deleted = false;      // USER_DELETE sent (or no longer to send)
};

class RRefBooks : public std::enable_shared_from_this<RRefBooks> {
 public:
  using NameOf = std::function<std::string(int)>;
  RRefBooks(
      int self,
      int world_size,
      Calls& calls,
      NameOf name_of,
      std::chrono::milliseconds rpc_timeout);
  ~RRefBooks();
  RRefBooks(const RRefBooks&) = delete;
  RRefBooks& operator=(const RRefBooks&) = delete;

  int self() const {
    return self_;
  }
  std::string name_of(int worker) const {
    return name_of_(worker);
  }
  // The context of a message to or from `peer` (no autograd record).
  MessageContext context(int peer);
  std::chrono::milliseconds rpc_timeout() const {
    return rpc_timeout_;
  }
  // The agent these books belong to; NetworkError once closed.
  void set_agent(RpcAgent* agent) {
    agent_ = agent;
  }
  RpcAgent& agent();

  // The functions of the RRef protocol ("tide.rref.*") the agent registers;
  // `find` gives the agent's function of a name (InvalidArgument when it
  // has none), which tide.rref.create runs.
  using FindHandler = std::function<Handler(const std::string&)>;
  std::vector<std::pair<std::string, Handler>> handlers(FindHandler find);

  // A user's side.
  RRefPtr local(Value value);
  RRefPtr start_remote(
      int to,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      Payload args,
      const ValueType* type);
  Future<Payload> call_owner(
      const RRefPtr& node,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      Payload args);
  // Throws the node's error, if it has one.
  void check_usable(const RRefNode& node);
  void write(Encoder& e, const RRefPtr& node);
  RRefPtr read(Decoder& d, const ValueType* want);
  // A node's last copy is gone: a user's deletes its fork on the owner.
  void user_gone(RRefNode& node);
  void handle_gone(RRefNode& node);

  // A request came from `caller`, on the loop, in the order requests
  // arrive: a creation (tide.rref.create) is registered now, before the
  // calls after it (which may pass the RRef back) run, in parallel, on the
  // pool. Throws InvalidArgument for a creation that does not decode.
  void on_arrival(int caller, const std::string& fn, const Payload& args);
  // The owner's side of tide.rref.create and tide.rref.fork: registers
  // the fork `holder` holds (none when the holder is this worker, the
  // owner) and returns the entry, made if new.
  std::shared_ptr<OwnerEntry> add_fork(
      const RRefId& id, const RRefId& fork, int holder);

  // A connection to or from `peer` was lost. On the loop.
  void peer_lost(int peer, const std::string& reason);
  bool is_lost(int peer);

  RRefReport report();
  // Graceful shutdown, before the group's barrier: waits until the RRefs
  // this worker passed on and received are confirmed, then deletes every
  // user RRef it still holds and waits for the owners' acknowledgements,
  // all within `timeout`. Returns what did not finish (empty: all did).
  std::vector<std::string> delete_all(std::chrono::milliseconds timeout);
  // After the barrier: what is still referenced, as leaks.
  std::vector<std::string> leaks();
  // No more messages: later drops send nothing, retries stop.
  void close();

  // Sends a control function with the rpc layers' retry
  // (rpc_core/retry.h): again after a timeout or a broken connection to a
  // live peer.
  Future<void> control(int to, std::string fn, std::string args);

 private:
  struct Child {
    RRefPtr parent;  // held until the child accepts
    int to = -1;
  };

  RRefId new_id();
  std::exception_ptr owner_lost(int owner, const RRefId& id);
  // A call to `owner` failed: as OwnerLostError when the owner is lost.
  std::exception_ptr as_owner_lost(
      std::exception_ptr error, int owner, const RRefId& id);
  bool closed();
  void confirm_user(const RRefId& fork, std::exception_ptr error);
  // From the worker `caller`, which must be the fork's holder (its child):
  // a peer cannot give up a fork another holds (InvalidArgument).
  void del_fork(const RRefId& id, const RRefId& fork, int caller);
  void child_accepted(const RRefId& fork, int caller);
  std::shared_ptr<OwnerEntry> entry_for(const RRefId& id, bool create);
  // The entry of `id`, made when there is none: a message that overtook
  // the creation (calls are served in parallel) waits for the value.
  // Under mutex_.
  std::map<RRefId, std::shared_ptr<OwnerEntry>>::iterator entry_locked(
      const RRefId& id);
  // Makes `node` a handle on `entry`, which stays in the books while
  // handles, forks or a creation keep it. Under mutex_.
  void own(RRefNode& node, const std::shared_ptr<OwnerEntry>& entry);
  // Removes an entry nothing keeps in the books; the caller drops it
  // after unlocking (its value's destructor may do anything).
  std::shared_ptr<OwnerEntry> release_if_unused(
      std::map<RRefId, std::shared_ptr<OwnerEntry>>::iterator it);

  const int self_;
  Calls& calls_;
  const NameOf name_of_;
  const std::chrono::milliseconds rpc_timeout_;
  const int world_size_;
  RpcAgent* agent_ = nullptr;
  std::atomic<int64_t> next_local_{1};
  std::atomic<uint64_t> retries_{0};

  std::mutex mutex_;
  std::condition_variable settled_cv_;  // pending users/children drop
  // All guarded by mutex_.
  std::map<RRefId, std::shared_ptr<OwnerEntry>> owners_;
  std::map<RRefId, RRefPtr> pending_users_;  // by fork, until confirmed
  std::map<RRefId, std::weak_ptr<RRefNode>> confirmed_users_;  // by fork
  std::map<RRefId, Child> pending_children_;                   // by fork
  std::set<int> lost_;
  bool closing_ = false;  // graceful shutdown deleted everything
  bool closed_ = false;
};

}  // namespace tide::rpc::detail
