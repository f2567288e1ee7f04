#include "torch_rpc/agent.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/ThreadLocalState.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/rpc/utils.h>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "common/clock.h"
#include "torch_rpc/wire.h"
#include "transport/workers.h"

namespace tide::torch_rpc {

using std::chrono::milliseconds;

namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

AgentOptions checked(AgentOptions o) {
  TORCH_CHECK(
      o.num_worker_threads >= 1,
      "num_worker_threads must be at least 1; got ",
      o.num_worker_threads);
  bool tcp = false;
  for (const auto& t : o.transports) {
    TORCH_CHECK(
        t == "tcp" || t == "shm",
        "unknown TIDE rpc transport '",
        t,
        "'; the transports are 'shm' and 'tcp'");
    tcp = tcp || t == "tcp";
  }
  TORCH_CHECK(
      tcp,
      "the TIDE rpc transports must include 'tcp' (the way to workers of "
      "other hosts, and shm's fallback)");
  TORCH_CHECK(
      o.lanes >= 0 && o.lanes <= static_cast<int>(transport::kMaxLanes),
      "lanes must be 0 to ",
      transport::kMaxLanes,
      "; got ",
      o.lanes);
  TORCH_CHECK(
      o.poll_us >= 0 && o.poll_us <= 100000,
      "poll_us must be 0 to 100000; got ",
      o.poll_us);
  return o;
}

// An error's text as a peer may read it: c10's errors without their
// backtrace (it gives the peer this process's code addresses).
std::string for_the_peer(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

struct Agent::Impl : std::enable_shared_from_this<Impl> {
  struct Call {
    c10::intrusive_ptr<tr::JitFuture> future;
    const void* pipe = nullptr;
    int peer = 0;
    milliseconds timeout{0};
    std::multimap<Clock::time_point, uint64_t>::iterator deadline;
    bool has_deadline = false;
  };

  const tr::RequestCallback* callback = nullptr;
  AgentOptions options;
  int world_size = 0;
  std::vector<tr::WorkerInfo> infos;  // by id
  std::unordered_map<std::string, int> ids;
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<transport::Transport> transport;
  // Run the requests; gone before the transport.
  std::unique_ptr<transport::Workers> workers;
  // Complete this worker's calls, whose futures' callbacks run user code
  // that may block: threads of their own, so that a completion never waits
  // behind functions that block (they may be waiting for it), nor runs on
  // the loop (a callback blocking there would stop the reading).
  std::unique_ptr<transport::Workers> completions;
  int join_round = 0;

  std::mutex mutex;
  std::unordered_map<uint64_t, Call> calls;               // Guarded by mutex.
  std::multimap<Clock::time_point, uint64_t> deadlines;   // Guarded by mutex.
  Clock::time_point alarm_at = Clock::time_point::max();  // Guarded.
  bool started = false;                                   // Guarded by mutex.
  bool stopped = false;                                   // Guarded by mutex.
  // Requests that came before start(): served once it runs.
  std::vector<std::pair<transport::Pipe, transport::Message>> early;
  std::atomic<uint64_t> next_id{1};

  // Counts for join() and the metrics.
  std::mutex count_mutex;
  std::condition_variable count_cv;
  int client_active = 0;  // Guarded by count_mutex.
  int server_active = 0;  // Guarded by count_mutex.
  int server_async = 0;   // Guarded by count_mutex.
  std::mutex gil_mutex;
  double gil_wait_us_sum = 0;  // Guarded by gil_mutex.
  uint64_t gil_waits = 0;      // Guarded by gil_mutex.

  // This worker's name, for messages (a copy: an async reply may be
  // written as the Agent is destroyed).
  std::string self_name;
  // Serving: from start() to shutdown (the Agent's rpcAgentRunning_, which
  // Impl may outlive).
  std::atomic<bool> serving{false};

  const std::string& name() const {
    return self_name;
  }

  void count(int& counter, int delta) {
    {
      std::lock_guard lock(count_mutex);
      counter += delta;
    }
    count_cv.notify_all();
  }

  // ---- the calls this worker makes ----

  void start_call(
      int peer,
      const c10::intrusive_ptr<tr::Message>& message,
      const c10::intrusive_ptr<tr::JitFuture>& future,
      milliseconds timeout) {
    uint64_t id = next_id.fetch_add(1);
    message->setId(static_cast<int64_t>(id));
    transport::Message wire = to_wire(message);
    transport::Pipe pipe = transport->pipe_to(peer);
    count(client_active, +1);
    {
      std::lock_guard lock(mutex);
      Call call{future, pipe.id(), peer, timeout, {}, false};
      if (timeout.count() > 0) {
        call.deadline = deadlines.emplace(Clock::now() + timeout, id);
        call.has_deadline = true;
        arm_alarm_locked();
      }
      calls.emplace(id, std::move(call));
    }
    std::string why;
    bool sent = false;
    try {
      sent = pipe.send(std::move(wire), &why);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!sent) {
      fail(id, "failed to send to " + transport->peer_label(peer) + ": " + why);
    }
  }

  // Takes call `id` off the books; with `pipe`, only when it went out on
  // that connection (a reply counts only from there).
  std::optional<Call> take(uint64_t id, const void* pipe = nullptr) {
    std::lock_guard lock(mutex);
    auto it = calls.find(id);
    if (it == calls.end() || (pipe != nullptr && it->second.pipe != pipe)) {
      return std::nullopt;
    }
    Call call = std::move(it->second);
    calls.erase(it);
    if (call.has_deadline) {
      deadlines.erase(call.deadline);
    }
    return call;
  }

  // Completes `call` on the completions' threads; here once they are
  // joined (a call failed during shutdown must still complete).
  void complete(
      Call call,
      c10::intrusive_ptr<tr::Message> reply,
      std::optional<std::string> error) {
    completions->run_or_here([this,
                              future = std::move(call.future),
                              reply = std::move(reply),
                              error = std::move(error)]() mutable {
      finish(*future, std::move(reply), std::move(error));
    });
  }

  // Completes a call's future (its callbacks run here), then counts it
  // done: after the callbacks, which may have sent more, so that join()
  // never sees zero in between. A callback that throws is logged.
  void finish(
      tr::JitFuture& future,
      c10::intrusive_ptr<tr::Message> reply,
      std::optional<std::string> error) {
    try {
      if (error) {
        future.setError(std::make_exception_ptr(std::runtime_error(*error)));
      } else {
        auto storages = reply->getStorages();
        future.markCompleted(c10::IValue(reply), std::move(storages));
      }
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("[{}] a call's callback threw: {}", name(), e.what());
    }
    count(client_active, -1);
  }

  void fail(uint64_t id, std::string why) {
    if (auto call = take(id)) {
      complete(std::move(*call), {}, std::move(why));
    }
  }

  void arm_alarm_locked() {
    if (deadlines.empty() || deadlines.begin()->first >= alarm_at) {
      return;
    }
    alarm_at = deadlines.begin()->first;
    transport->set_alarm(alarm_at, [this] { expire(); });
  }

  // On the loop.
  void expire() {
    std::vector<Call> late;
    {
      std::lock_guard lock(mutex);
      alarm_at = Clock::time_point::max();
      auto now = Clock::now();
      while (!deadlines.empty() && deadlines.begin()->first <= now) {
        uint64_t id = deadlines.begin()->second;
        deadlines.erase(deadlines.begin());
        auto it = calls.find(id);
        if (it != calls.end()) {
          it->second.has_deadline = false;
          // Its request may still wait behind others: not sent late.
          transport->cancel(it->second.peer, id);
          late.push_back(std::move(it->second));
          calls.erase(it);
        }
      }
      arm_alarm_locked();
    }
    for (auto& call : late) {
      auto text = fmt::format(tr::kRpcTimeoutErrorStr, call.timeout.count());
      complete(
          std::move(call),
          {},
          tr::makeRPCError(text, tr::RPCErrorType::TIMEOUT));
    }
  }

  // ---- the transport's events, on the loop ----

  void on_message(const transport::Pipe& pipe, transport::Message m) {
    if (m.type == kTorchResponse) {
      if (auto call = take(m.id, pipe.id())) {
        c10::intrusive_ptr<tr::Message> msg;
        try {
          msg = from_wire(std::move(m));
        } catch (const std::exception& e) {
          // The connection goes (the throw); this call goes with it.
          complete(
              std::move(*call),
              {},
              "malformed reply from " + transport->peer_label(pipe.peer()) +
                  ": " + e.what());
          throw;
        }
        if (msg->type() == tr::MessageType::EXCEPTION) {
          std::string text(msg->payload().begin(), msg->payload().end());
          complete(std::move(*call), {}, std::move(text));
        } else {
          complete(std::move(*call), std::move(msg), std::nullopt);
        }
      }
      return;
    }
    {
      std::lock_guard lock(mutex);
      if (stopped) {
        return;
      }
      if (!started) {
        // Before start(), bounded as the workers' queue is.
        if (early.size() >= transport::Workers::kMaxQueuedRequests) {
          throw ProtocolError(
              "more than " +
              std::to_string(transport::Workers::kMaxQueuedRequests) +
              " requests before this worker started");
        }
        early.emplace_back(pipe, std::move(m));
        return;
      }
    }
    serve_on_pool(pipe, std::move(m));
  }

  void on_closed(const transport::Pipe& pipe, const std::string& reason) {
    if (!pipe.outgoing()) {
      return;
    }
    std::vector<uint64_t> lost;
    {
      std::lock_guard lock(mutex);
      for (const auto& [id, call] : calls) {
        if (call.pipe == pipe.id()) {
          lost.push_back(id);
        }
      }
    }
    std::string why = "connection to " + transport->peer_label(pipe.peer()) +
                      " lost: " + reason;
    for (uint64_t id : lost) {
      fail(id, why);
    }
  }

  // ---- the requests this worker serves ----

  void serve_on_pool(const transport::Pipe& pipe, transport::Message m) {
    if (workers->full()) {
      count(server_active, +1);
      count(server_async, +1);
      auto refused =
          c10::make_intrusive<tr::JitFuture>(at::AnyClassType::get());
      refused->setError(std::make_exception_ptr(std::runtime_error(
          "worker '" + name() + "' has " + std::to_string(workers->queued()) +
          " requests waiting for a thread already; this one was refused "
          "(retry later)")));
      respond(pipe, m.id, *refused);
      return;
    }
    count(server_active, +1);
    bool queued = workers->run(
        [self = shared_from_this(), pipe, m = std::move(m)]() mutable {
          self->serve(pipe, std::move(m));
        });
    if (!queued) {
      count(server_active, -1);  // shutting down: dropped
    }
  }

  void serve(const transport::Pipe& pipe, transport::Message m) {
    uint64_t id = m.id;
    c10::intrusive_ptr<tr::JitFuture> future;
    // The thread's torch state (grad mode, dispatch keys, RecordFunction
    // callbacks, ...) goes back to what it was once torch has taken the
    // request: torch 1.13's profiled requests leave a RecordFunction
    // callback on the thread that served them, so the next profiled request
    // it serves records every op twice and the caller's profiler drops them.
    at::ThreadLocalStateGuard as_found{at::ThreadLocalState()};
    try {
      auto request = from_wire(std::move(m));
      future = (*callback)(*request, {});
    } catch (const std::exception&) {
      future = c10::make_intrusive<tr::JitFuture>(at::AnyClassType::get());
      future->setError(std::current_exception());
    }
    count(server_async, +1);
    std::weak_ptr<Impl> weak = weak_from_this();
    future->addCallback([weak, pipe, id](tr::JitFuture& done) {
      if (auto self = weak.lock()) {
        self->respond(pipe, id, done);
      }
    });
  }

  void respond(const transport::Pipe& pipe, uint64_t id, tr::JitFuture& done) {
    count(server_active, -1);
    count(server_async, -1);
    if (!serving.load()) {
      TIDE_LOG_DEBUG(
          "[{}] not answering request {}: rpc is shutting down", name(), id);
      return;
    }
    c10::intrusive_ptr<tr::Message> reply;
    transport::Message wire;
    try {
      reply = done.hasError() ? tr::createExceptionResponse(
                                    for_the_peer(done.exception_ptr()),
                                    static_cast<int64_t>(id))
                              : done.value().toCustomClass<tr::Message>();
      reply->setId(static_cast<int64_t>(id));
      wire = to_wire(reply);
    } catch (const std::exception&) {
      wire = to_wire(tr::createExceptionResponse(
          for_the_peer(std::current_exception()), static_cast<int64_t>(id)));
    }
    std::string why;
    bool sent = false;
    try {
      sent = pipe.send(std::move(wire), &why);
    } catch (const std::exception& e) {
      // Over the frame limits: the caller learns why instead of waiting
      // (unless it does not read at all: then nothing more goes).
      try {
        sent = pipe.send(
            to_wire(tr::createExceptionResponse(
                std::string("the reply could not be sent: ") + e.what(),
                static_cast<int64_t>(id))),
            &why);
      } catch (const std::exception& again) {
        why = again.what();
      }
    }
    if (!sent) {
      TIDE_LOG_DEBUG(
          "[{}] the answer to request {} was dropped: {}", name(), id, why);
    }
  }

  // ---- the group ----

  void rendezvous(int rank, const std::string& self) {
    transport::PeerAddress me;
    me.name = self;
    me.host = options.listen_host;
    me.port = transport->port();
    me.host_key = transport::local_host_key();
    me.local_name = transport->local_name();
    store->set(
        "tide/workers/" + std::to_string(rank), bytes(encode_worker_entry(me)));
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) {
      keys.push_back("tide/workers/" + std::to_string(r));
    }
    try {
      store->wait(
          keys,
          options.rpcTimeoutSeconds <= 0
              ? c10d::Store::kNoTimeout
              : milliseconds(
                    static_cast<int64_t>(options.rpcTimeoutSeconds * 1000)));
    } catch (const std::exception& e) {
      TORCH_CHECK(
          false,
          "the TIDE rpc group of ",
          world_size,
          " workers did not complete within the rpc timeout (",
          options.rpcTimeoutSeconds,
          " s): ",
          e.what());
    }
    std::vector<transport::PeerAddress> peers;
    for (int r = 0; r < world_size; ++r) {
      auto raw = store->get(keys[static_cast<size_t>(r)]);
      auto p = decode_worker_entry(r, std::string(raw.begin(), raw.end()));
      auto [it, fresh] = ids.emplace(p.name, r);
      TORCH_CHECK(
          fresh,
          "RPC worker name ",
          p.name,
          " is not unique: ranks ",
          it->second,
          " and ",
          r,
          " share it");
      infos.emplace_back(p.name, static_cast<tr::worker_id_t>(r));
      peers.push_back(std::move(p));
    }
    transport->set_peers(std::move(peers));
  }

  // One round of counts through the store: every worker adds its count of
  // calls in flight, and all learn the total once the last has added.
  int64_t sync_counts(int64_t active) {
    std::string prefix = "tide/join/" + std::to_string(join_round++) + "/";
    store->add(prefix + "active", active);
    if (store->add(prefix + "arrived", 1) == world_size) {
      store->set(prefix + "done", bytes("1"));
    }
    store->wait({prefix + "done"});
    return store->add(prefix + "active", 0);
  }

  // Stops the transport and the pool, then fails what still waits.
  void stop() {
    {
      std::lock_guard lock(mutex);
      if (stopped) {
        return;
      }
      stopped = true;
      early.clear();
    }
    transport->shutdown();
    transport->join();
    workers->join();
    completions->join();
    std::vector<Call> left;
    {
      std::lock_guard lock(mutex);
      for (auto& [id, call] : calls) {
        left.push_back(std::move(call));
      }
      calls.clear();
      deadlines.clear();
    }
    for (auto& call : left) {
      finish(
          *call.future,
          {},
          "RPC agent of worker '" + name() +
              "' shut down before the reply came");
    }
  }
};

Agent::Agent(
    const c10::intrusive_ptr<c10d::Store>& store,
    std::string name,
    int rank,
    int world_size,
    AgentOptions options,
    std::unique_ptr<tr::RequestCallback> callback,
    std::function<void()> worker_thread_init)
    : tr::RpcAgent(
          tr::WorkerInfo(std::move(name), static_cast<int64_t>(rank)),
          std::move(callback),
          milliseconds(static_cast<int64_t>(options.rpcTimeoutSeconds * 1000))),
      impl_(std::make_shared<Impl>()) {
  Impl& impl = *impl_;
  TORCH_CHECK(
      rank >= 0 && rank < world_size,
      "rank ",
      rank,
      " is outside world_size ",
      world_size);
  impl.self_name = workerInfo_.name_;
  impl.callback = cb_.get();
  impl.options = checked(std::move(options));
  impl.world_size = world_size;
  impl.store = store;
  bool shm = std::find(
                 impl.options.transports.begin(),
                 impl.options.transports.end(),
                 "shm") != impl.options.transports.end();
  try {
    impl.transport = std::make_unique<transport::Transport>(
        transport::TransportOptions{
            rank,
            workerInfo_.name_,
            impl.options.listen_host,
            shm,
            impl.options.token,
            static_cast<size_t>(impl.options.lanes),
            torch_message_types(),
            std::chrono::microseconds(impl.options.poll_us)},
        transport::TransportHandlers{
            .on_message =
                [&impl](const transport::Pipe& pipe, transport::Message m) {
                  impl.on_message(pipe, std::move(m));
                },
            .on_closed =
                [&impl](const transport::Pipe& pipe, const std::string& why) {
                  impl.on_closed(pipe, why);
                },
        });
    impl.workers = std::make_unique<transport::Workers>(
        *impl.transport,
        static_cast<size_t>(impl.options.num_worker_threads),
        worker_thread_init);
    impl.completions = std::make_unique<transport::Workers>(
        *impl.transport,
        static_cast<size_t>(impl.options.num_worker_threads),
        std::move(worker_thread_init));
    impl.rendezvous(rank, workerInfo_.name_);
  } catch (...) {
    if (impl.completions) {
      impl.stop();
    }
    throw;
  }
  TIDE_LOG_DEBUG(
      "[{}] torch rpc agent up: rank {} of {}, port {}",
      workerInfo_.name_,
      rank,
      world_size,
      impl.transport->port());
}

Agent::~Agent() {
  // Still running when rpc.shutdown() was skipped: shut down here, while
  // shutdownImpl() is still this class's.
  if (rpcAgentRunning_.load()) {
    try {
      shutdown();
    } catch (const std::exception& e) {
      TIDE_LOG_WARN(
          "[{}] torch rpc shutdown failed: {}", impl_->name(), e.what());
    }
  }
  impl_->stop();
}

c10::intrusive_ptr<tr::JitFuture> Agent::send(
    const tr::WorkerInfo& to,
    c10::intrusive_ptr<tr::Message> message,
    float rpc_timeout_seconds,
    const tr::DeviceMap& device_map) {
  TORCH_CHECK(
      message->isRequest(),
      "the TIDE rpc agent's send() carries requests only; got message type ",
      message->type());
  TORCH_CHECK(
      device_map.empty(),
      "the TIDE rpc backend carries CPU tensors only; device maps are not "
      "supported (move the tensors to the CPU, or use the TENSORPIPE backend)");
  TORCH_CHECK(
      rpcAgentRunning_.load(),
      "worker '",
      workerInfo_.name_,
      "' tried to send a message of type ",
      message->type(),
      " but RPC is no longer running on it");
  TORCH_CHECK(
      to.id_ >= 0 && to.id_ < impl_->world_size,
      "no TIDE rpc worker has id ",
      to.id_);
  auto timeout = rpc_timeout_seconds == tr::kUnsetRpcTimeout
                     ? getRpcTimeout()
                     : milliseconds(static_cast<int64_t>(
                           rpc_timeout_seconds * tr::kSecToMsConversion));
  auto future = c10::make_intrusive<tr::JitFuture>(at::AnyClassType::get());
  impl_->start_call(to.id_, message, future, timeout);
  return future;
}

const tr::WorkerInfo& Agent::getWorkerInfo(
    const std::string& worker_name) const {
  auto it = impl_->ids.find(worker_name);
  TORCH_CHECK(
      it != impl_->ids.end(),
      fmt::format(
          "name:{},rank:{} could not find destination name {}",
          workerInfo_.name_,
          workerInfo_.id_,
          worker_name));
  return impl_->infos[static_cast<size_t>(it->second)];
}

const tr::WorkerInfo& Agent::getWorkerInfo(tr::worker_id_t id) const {
  TORCH_CHECK(
      id >= 0 && id < impl_->world_size,
      fmt::format(
          "name:{},rank:{} could not find destination id {}",
          workerInfo_.name_,
          workerInfo_.id_,
          id));
  return impl_->infos[static_cast<size_t>(id)];
}

std::vector<tr::WorkerInfo> Agent::getWorkerInfos() const {
  return impl_->infos;
}

void Agent::join(bool shutdown, float /*timeout*/) {
  Impl& impl = *impl_;
  // A barrier that holds until no worker has a call in flight, nested and
  // follow-up calls included (each served request answers a call some
  // worker counts).
  for (;;) {
    {
      std::unique_lock lock(impl.count_mutex);
      impl.count_cv.wait(lock, [&] { return impl.client_active == 0; });
    }
    impl.sync_counts(0);
    int active = 0;
    {
      std::lock_guard lock(impl.count_mutex);
      active = impl.client_active;
    }
    if (impl.sync_counts(active) == 0) {
      break;
    }
  }
  if (shutdown) {
    impl.sync_counts(0);
  }
}

void Agent::startImpl() {
  std::vector<std::pair<transport::Pipe, transport::Message>> early;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->started = true;
    impl_->serving.store(true);
    early.swap(impl_->early);
  }
  for (auto& [pipe, m] : early) {
    impl_->serve_on_pool(pipe, std::move(m));
  }
}

void Agent::shutdownImpl() {
  TIDE_LOG_DEBUG("[{}] torch rpc agent shutting down", workerInfo_.name_);
  impl_->serving.store(false);
  impl_->stop();
}

std::unordered_map<std::string, std::string> Agent::getMetrics() {
  Impl& impl = *impl_;
  std::unordered_map<std::string, std::string> m;
  int threads = impl.options.num_worker_threads;
  m["agent.thread_pool_size"] = std::to_string(threads);
  m["agent.num_idle_threads"] =
      std::to_string(threads - static_cast<int>(impl.workers->busy()));
  {
    std::lock_guard lock(impl.count_mutex);
    m["agent.client_active_calls"] = std::to_string(impl.client_active);
    m["agent.server_active_calls"] = std::to_string(impl.server_active);
    m["agent.server_active_async_calls"] = std::to_string(impl.server_async);
  }
  if (isGILProfilingEnabled()) {
    std::lock_guard lock(impl.gil_mutex);
    m["agent.gil_average_wait_time_us"] = std::to_string(
        impl.gil_waits == 0 ? 0.0 : impl.gil_wait_us_sum / impl.gil_waits);
  }
  auto stats = impl.transport->stats();
  m["tide.buffers_via_shm"] = std::to_string(stats.buffers_via_shm);
  m["tide.buffers_via_lanes"] = std::to_string(stats.buffers_via_lanes);
  return m;
}

void Agent::addGilWaitTime(std::chrono::microseconds gil_wait_time) {
  std::lock_guard lock(impl_->gil_mutex);
  impl_->gil_wait_us_sum += static_cast<double>(gil_wait_time.count());
  ++impl_->gil_waits;
}

std::string Agent::connection_kind(const std::string& worker) {
  return impl_->transport->connection_kind(getWorkerInfo(worker).id_);
}

const AgentOptions& Agent::options() const {
  return impl_->options;
}

}  // namespace tide::torch_rpc
