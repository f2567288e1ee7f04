#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/common/future.h"
#include "tide/rpc/detail/call.h"
#include "tide/rpc/serialize.h"

// tide's RPC agent and its calls: the counterpart of torch.distributed.rpc
// (remote references: tide/rpc/rref.h; tensors: tide/rpc/tensor.h; all of
// it: tide/rpc/rpc.h).
//
//   RpcAgent agent("worker0", 0, 2, RpcBackendOptions{.init_method =
//                                                      "tcp://10.0.0.1:29500"});
//   agent.register_function("add", [](int64_t a, int64_t b) { return a + b; });
//   int64_t s = agent.rpc_sync<int64_t>("worker1", "add", 2, 3);
//   Future<int64_t> f = agent.rpc_async<int64_t>("worker1", "add",
//                                                std::chrono::milliseconds(500),
//                                                2, 3);
//   agent.shutdown();  // waits until every worker is idle
//
// Errors of a call arrive in its future (rpc_sync throws them):
//   RemoteError     the function threw on the callee; the message names the
//                   function, the worker, the exception's type and message
//                   (a wrong argument type is an InvalidArgument there)
//   TimeoutError    no reply within the call's timeout (the call may still
//                   run on the callee; a late reply is dropped)
//   NetworkError    the connection to the callee failed, or the agent is shut
//                   down
//   InvalidArgument unknown worker name (thrown by rpc_async itself)
//
// Threading: one I/O thread per agent and a pool of num_worker_threads (T)
// that runs the functions called on it. Up to T functions may block at once
// (a lock, a condition, a call to another worker) while the agent goes on
// reading, answering and completing calls; the (T+1)th waits for a thread.
// Continuations of the futures rpc_async and RRef calls return run on
// threads of their own (another num_worker_threads), so they may block too
// (an rpc_sync inside a then()) and never wait behind blocked functions.
namespace tide::store {
class Store;
}  // namespace tide::store

namespace tide::rpc {

class RpcAgent;
template <typename T>
class RRef;
struct RRefReport;

struct WorkerInfo {
  std::string name;
  int id = 0;

  bool operator==(const WorkerInfo&) const = default;
};

// tide's one backend: shared memory between processes of one host, TCP
// between hosts (torch's is TENSORPIPE).
enum class BackendType { kTide };

struct RpcBackendOptions {
  // Threads running the functions called on this worker.
  int num_worker_threads = 16;
  // Default timeout of a call, and of the rendezvous in the constructor.
  std::chrono::milliseconds rpc_timeout{60000};
  // Where the rendezvous store is: "env://" (MASTER_ADDR, MASTER_PORT) or
  // "tcp://host:port". Rank 0 hosts the store there.
  std::string init_method = "env://";
  // Address this worker listens on for calls (on a kernel-picked port).
  std::string listen_host = "127.0.0.1";
  // How calls may travel, like torch's _transports: "shm" (a Unix socket
  // and shared memory, to workers of this host and network namespace) and
  // "tcp" (to any worker; required). {"tcp"} forces TCP everywhere.
  std::vector<std::string> transports = {"shm", "tcp"};
  // When not empty, every worker of the group must have the same token: a
  // connection that does not present it is refused (and its calls fail with
  // NetworkError), and the store of tcp:// hosted by rank 0 requires it too.
  // Empty takes TIDE_RPC_TOKEN from the environment, if set.
  std::string token;
  // Over TCP, a buffer (tensor) of 1 MiB or more is cut into this many
  // parts, each sent on a TCP connection of its own ("lanes", opened beside
  // a pair's connection when the first such buffer crosses it), so that one
  // large tensor is carried by several streams and cores at once (torch's
  // multiplexed mpt_uv channel). 0 sends everything on the one connection.
  // At most 16.
  int tcp_lanes = 2;
  // How long, in microseconds, a worker's I/O thread, a worker thread
  // waiting for its next function and a caller waiting for its reply keep
  // polling after their last work before they sleep (0 to 100000). Waking
  // a sleeping thread costs 50-200 us on a virtual machine, more than a
  // round trip on one host; polling costs CPU meanwhile (each such thread,
  // up to this long after each burst of messages). Lower it to save CPU on
  // workers whose messages are far apart.
  int poll_us = 300;
  // A graceful shutdown that finds RRefs it could not delete, or owned
  // values some user still references, logs them; with this set it also
  // throws InternalError listing them (a test's leak check).
  bool fail_on_rref_leak = false;
};

// One worker of an RPC group. Normally one per process; several may live in
// one process (tests do), each with its own port and threads.
// Thread safety: every member is thread safe.
class RpcAgent {
 public:
  // Joins the group: rank 0 hosts a TcpStore at options.init_method, every
  // worker listens on options.listen_host (port 0), publishes its name, id
  // and address, and waits for all world_size workers, at most
  // options.rpc_timeout. Throws InvalidArgument for a bad rank, a name
  // another worker has, a world size other workers disagree with;
  // RendezvousError when the group is not complete in time; NetworkError when
  // the store or the listening address cannot be used.
  RpcAgent(
      std::string name,
      int rank,
      int world_size,
      RpcBackendOptions options = {});
  // The same over a store the caller provides (shared by the group).
  RpcAgent(
      std::string name,
      int rank,
      int world_size,
      RpcBackendOptions options,
      std::shared_ptr<store::Store> store);
  // Stops at once (shutdown(false)) unless shut down already.
  ~RpcAgent();

  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  // This worker.
  const WorkerInfo& get_worker_info() const;
  // The worker called `name`; throws InvalidArgument naming the known ones.
  WorkerInfo get_worker_info(const std::string& name) const;
  // Every worker, by id.
  std::vector<WorkerInfo> worker_infos() const;

  // Makes `fn` callable as `name` on this worker. fn is any callable whose
  // arguments and result serialize (serialize.h); it may return Future<T>,
  // and then the call completes when that future does, without holding a
  // worker thread. Replaces an earlier function of that name.
  template <typename F>
  void register_function(const std::string& name, F fn) {
    add_handler(name, detail::make_handler(std::move(fn)));
  }

  // Calls `fn(args...)` on worker `to`; the future holds its result as an R
  // (R = void for none). timeout 0 is the agent's rpc_timeout. Never blocks.
  template <typename R, typename... A>
  Future<R> rpc_async(
      const std::string& to,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      const A&... args) {
    int id = get_worker_info(to).id;
    detail::GradsPtr grads = detail::autograd_call(*this, id);
    detail::MessageContext context = message_context(id);
    context.grads = grads.get();
    return detail::decode_reply<R>(
        *this,
        call(id, fn, timeout, detail::encode_call(context, args...)),
        fn,
        context,
        std::move(grads));
  }
  template <typename R, typename... A>
  Future<R> rpc_async(
      const std::string& to, const std::string& fn, const A&... args) {
    return rpc_async<R>(to, fn, std::chrono::milliseconds(0), args...);
  }

  // rpc_async, then waits: returns the result or throws the call's error.
  template <typename R, typename... A>
  R rpc_sync(
      const std::string& to,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      const A&... args) {
    return wait(rpc_async<R>(to, fn, timeout, args...), timeout);
  }
  template <typename R, typename... A>
  R rpc_sync(const std::string& to, const std::string& fn, const A&... args) {
    return rpc_sync<R>(to, fn, std::chrono::milliseconds(0), args...);
  }

  // Runs `fn(args...)` on worker `to` and keeps its result there: returns
  // at once an RRef to it (rref.h), owned by `to`. An error of the function
  // or of the creation surfaces on the RRef's next use. timeout 0 is the
  // agent's rpc_timeout.
  template <typename R, typename... A>
  RRef<R> remote(
      const std::string& to,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      const A&... args);
  template <typename R, typename... A>
  RRef<R> remote(
      const std::string& to, const std::string& fn, const A&... args);

  // The RRefs this worker owns and holds (rref.h).
  RRefReport rrefs() const;

  // Waits for `f` (a call's, an RRef's) as rpc_sync does: this thread reads
  // the agent's replies itself meanwhile instead of being woken for them.
  // Returns f's value or throws its error. The call's own timer completes
  // f; `timeout` (0: rpc_timeout) plus 30 s only guards against a lost
  // completion (TimeoutError).
  template <typename T>
  T wait(const Future<T>& f, std::chrono::milliseconds timeout = {}) {
    help_until([&f] { return f.ready(); });
    return f.wait(effective_timeout(timeout) + std::chrono::seconds(30));
  }

  // graceful: waits until no worker of the group has calls pending or
  // functions running (a barrier through the store, each worker entering once
  // its own work is done), then stops. Before that it deletes the RRefs it
  // holds and waits for their owners' acknowledgements (rref.h). Otherwise
  // stops at once: pending calls fail with NetworkError. Blocks;
  // idempotent. Throws TimeoutError when the group does not finish within
  // 10 rpc_timeouts (the agent is stopped anyway), and InternalError when
  // RRefs leaked and RpcBackendOptions::fail_on_rref_leak is set.
  void shutdown(bool graceful = true);

  // Calls this agent made that have not completed; functions running on it.
  size_t num_pending_calls() const;
  size_t num_running_functions() const;
  // Of the num_worker_threads that run functions, those not inside one now
  // (torch's getMetrics()["agent.num_idle_threads"]).
  size_t num_idle_threads() const;

  // How this worker's calls to worker `name` travel: "shm" or "tcp"; "" when
  // it has not called it yet (connections open on the first call).
  std::string transport_to(const std::string& name) const;

  // Buffers this worker sent through shared memory, and the segments it
  // made for them; buffers it received that way and sent back whole (a
  // returned tensor), which travel as references to the peer's segment;
  // buffers it sent cut over TCP lanes.
  struct TransportStats {
    uint64_t buffers_via_shm = 0;
    uint64_t bytes_via_shm = 0;
    uint64_t segments = 0;
    uint64_t buffers_returned = 0;
    uint64_t buffers_via_lanes = 0;
    uint64_t bytes_via_lanes = 0;
  };
  TransportStats transport_stats() const;

  struct Impl;

 private:
  // The agent's state, for the rpc part's own sources (rpc_agent.cpp);
  // found by argument-dependent lookup.
  friend Impl& impl_of(RpcAgent& agent);

  void add_handler(const std::string& name, detail::Handler handler);
  Future<detail::Payload> call(
      int to,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      detail::Payload args);
  // The context of a message to or from worker `peer`.
  detail::MessageContext message_context(int peer) const;
  std::chrono::milliseconds effective_timeout(
      std::chrono::milliseconds timeout) const;
  // While a reply is near, this thread reads it itself (the transport's
  // help()) instead of being woken for it.
  void help_until(const std::function<bool()>& done);

  std::unique_ptr<Impl> impl_;
};

// The agent serving the function this thread runs (while it runs), or else
// the process's agent: what the free functions below and RRef<T>(value)
// use. Throws InvalidArgument when there is none (init_rpc has not run, or
// shutdown has).
RpcAgent& current_agent();

// Creates the process's agent (torch.distributed.rpc.init_rpc). Throws
// InvalidArgument when one exists already, and what RpcAgent throws.
void init_rpc(
    const std::string& name,
    int rank,
    int world_size,
    RpcBackendOptions options = {});

// Shuts the process's agent down and destroys it. It stays the process's
// agent until its shutdown is done: functions serving the last calls of a
// graceful shutdown may use the free functions.
void shutdown(bool graceful = true);

inline WorkerInfo get_worker_info() {
  return current_agent().get_worker_info();
}
inline WorkerInfo get_worker_info(const std::string& name) {
  return current_agent().get_worker_info(name);
}

template <typename R, typename... A>
Future<R> rpc_async(
    const std::string& to, const std::string& fn, const A&... args) {
  return current_agent().rpc_async<R>(to, fn, args...);
}
template <typename R, typename... A>
R rpc_sync(const std::string& to, const std::string& fn, const A&... args) {
  return current_agent().rpc_sync<R>(to, fn, args...);
}
}  // namespace tide::rpc
