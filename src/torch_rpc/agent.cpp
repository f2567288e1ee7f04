#include "torch_rpc/agent.h"

#include <mutex>
#include <optional>
#include <system_error>
#include <utility>

#include <ATen/ThreadLocalState.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/rpc/utils.h>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "rpc_core/call_metrics.h"
#include "rpc_core/endpoint.h"
#include "rpc_core/in_flight.h"
#include "rpc_core/peer_table.h"
#include "rpc_core/request_gate.h"
#include "torch_rpc/wire.h"
#include "transport/workers.h"

namespace tide::torch_rpc {

using std::chrono::milliseconds;

namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// torch's store as the group meets through it.
class GroupStoreOf : public rpc_core::GroupStore {
 public:
  explicit GroupStoreOf(c10::intrusive_ptr<c10d::Store> store)
      : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, bytes(value));
  }
  std::string compare_set(
      const std::string& key,
      const std::string& expected,
      const std::string& desired) override {
    auto now = store_->compareSet(key, bytes(expected), bytes(desired));
    return {now.begin(), now.end()};
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return store_->add(key, delta);
  }
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override {
    // torch's stores say a wait ran out only in their text (c10::Error,
    // or std::system_error from HashStore).
    try {
      store_->wait(keys, timeout);
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      if (what.find("imeout") == std::string::npos) {
        throw;
      }
      throw TimeoutError(what);
    } catch (const std::system_error& e) {
      if (std::string(e.what()).find("imeout") == std::string::npos) {
        throw;
      }
      throw TimeoutError(e.what());
    }
  }
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override {
    std::vector<std::string> out;
    for (const auto& k : keys) {
      auto v = store_->get(k);
      out.emplace_back(v.begin(), v.end());
    }
    return out;
  }
  milliseconds default_timeout() const {
    return store_->getTimeout();
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

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
  using Reply = c10::intrusive_ptr<tr::Message>;
  using Calls = rpc_core::CallTable<Reply>;
  using Endpoint = rpc_core::Endpoint<Reply>;

  const tr::RequestCallback* callback = nullptr;
  AgentOptions options;
  int world_size = 0;
  rpc_core::PeerTable<tr::WorkerInfo> peers;
  std::unique_ptr<GroupStoreOf> store;
  std::unique_ptr<rpc_core::GroupBarrier> barrier;

  transport::Transport& transport() {
    return endpoint->transport();
  }
  transport::Workers& workers() {
    return endpoint->workers();
  }
  Calls& calls() {
    return endpoint->calls();
  }

  std::mutex mutex;
  bool stopped = false;  // Guarded by mutex.
  // Opens at start(): requests that come before wait for it.
  rpc_core::RequestGate gate;

  // The calls this worker waits for (join() drains them), and what it
  // serves; for join() and the metrics.
  rpc_core::InFlight client_active;
  std::mutex count_mutex;
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

  // Last, so that it goes first: its threads use everything above until
  // they are joined.
  std::unique_ptr<Endpoint> endpoint;

  const std::string& name() const {
    return self_name;
  }

  void count(int& counter, int delta) {
    std::lock_guard lock(count_mutex);
    counter += delta;
  }

  // ---- the calls this worker makes ----

  void start_call(
      int peer,
      const c10::intrusive_ptr<tr::Message>& message,
      const c10::intrusive_ptr<tr::JitFuture>& future,
      milliseconds timeout) {
    uint64_t id = calls().new_id();
    message->setId(static_cast<int64_t>(id));
    transport::Message wire = to_wire(message);
    client_active.add(1);
    calls().start(
        peer,
        std::move(wire),
        timeout,
        [this, future, peer, timeout](Calls::End end) mutable {
          complete(std::move(future), outcome(end, peer, timeout));
        });
  }

  // What a call's future completes with: the reply, or torch's text of
  // why there is none.
  std::pair<Reply, std::optional<std::string>> outcome(
      Calls::End& end, int peer, milliseconds timeout) {
    using How = Calls::How;
    auto to = [&] { return transport().peer_label(peer); };
    switch (end.how) {
      case How::kReplied:
        if (end.reply->type() == tr::MessageType::EXCEPTION) {
          const auto& text = end.reply->payload();
          return {{}, std::string(text.begin(), text.end())};
        }
        return {std::move(end.reply), std::nullopt};
      case How::kTimedOut:
        return {
            {},
            tr::makeRPCError(
                fmt::format(tr::kRpcTimeoutErrorStr, timeout.count()),
                tr::RPCErrorType::TIMEOUT)};
      case How::kBadReply:
        return {{}, "malformed reply from " + to() + ": " + end.reason};
      case How::kLost:
        return {{}, "connection to " + to() + " lost: " + end.reason};
      case How::kNotSent:
        return {{}, "failed to send to " + to() + ": " + end.reason};
      case How::kStopped:
        break;
    }
    return {{}, end.reason};
  }

  // Completes a call's future on the completions' threads; here once they
  // are joined (a call failed during shutdown must still complete).
  void complete(
      c10::intrusive_ptr<tr::JitFuture> future,
      std::pair<Reply, std::optional<std::string>> outcome) {
    endpoint->completions()->run_or_here(
        [this,
         future = std::move(future),
         outcome = std::move(outcome)]() mutable {
          finish(*future, std::move(outcome.first), std::move(outcome.second));
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
    client_active.add(-1);
  }

  // ---- the transport's events, on the loop ----

  void on_reply(const transport::Pipe& pipe, transport::Message m) {
    uint64_t id = m.id;
    c10::intrusive_ptr<tr::Message> reply;
    try {
      if (m.type != kTorchResponse) {
        throw ProtocolError(
            std::string("unexpected ") + torch_message_types().name(m.type) +
            " from a callee");
      }
      reply = from_wire(std::move(m));
    } catch (const std::exception& e) {
      // The connection goes (the throw); the call goes with it.
      calls().on_bad_reply(pipe, id, e.what());
      throw;
    }
    calls().on_reply(pipe, id, std::move(reply));
  }

  void on_request(const transport::Pipe& pipe, transport::Message m) {
    {
      std::lock_guard lock(mutex);
      if (stopped) {
        return;
      }
    }
    if (!gate.hold(pipe, m)) {
      serve_on_pool(pipe, std::move(m));
    }
  }

  // ---- the requests this worker serves ----

  void serve_on_pool(const transport::Pipe& pipe, transport::Message m) {
    if (workers().full()) {
      count(server_active, +1);
      count(server_async, +1);
      auto refused =
          c10::make_intrusive<tr::JitFuture>(at::AnyClassType::get());
      refused->setError(std::make_exception_ptr(std::runtime_error(
          rpc_core::busy_refusal(name(), workers().queued(), "this one"))));
      respond(pipe, m.id, *refused);
      return;
    }
    count(server_active, +1);
    bool queued = workers().run(
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
    rpc_core::call_served(
        done.hasError() ? rpc_core::Outcome::kError : rpc_core::Outcome::kOk);
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

  void rendezvous(int rank) {
    for (const auto& p : endpoint->meet(
             *store,
             rank,
             options.listen_host,
             world_size,
             options.rpcTimeoutSeconds <= 0
                 ? c10d::Store::kNoTimeout
                 : milliseconds(static_cast<int64_t>(
                       options.rpcTimeoutSeconds * 1000)))) {
      peers.add(
          p.name, tr::WorkerInfo(p.name, static_cast<tr::worker_id_t>(p.id)));
    }
  }

  // Stops the transport and the pool, then fails what still waits.
  void stop() {
    {
      std::lock_guard lock(mutex);
      if (stopped) {
        return;
      }
      stopped = true;
    }
    gate.drop();
    if (endpoint) {
      endpoint->stop(
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
  impl.options = std::move(options);
  impl.world_size = world_size;
  impl.store = std::make_unique<GroupStoreOf>(store);
  impl.barrier =
      std::make_unique<rpc_core::GroupBarrier>(*impl.store, world_size);
  try {
    rpc_core::Options core = rpc_core::checked(impl.options);
    impl.options.token = core.token;
    impl.endpoint = std::make_unique<Impl::Endpoint>(
        core,
        rank,
        workerInfo_.name_,
        torch_message_types(),
        Impl::Endpoint::Handlers{
            .on_request =
                [&impl](const transport::Pipe& pipe, transport::Message m) {
                  impl.on_request(pipe, std::move(m));
                },
            .on_reply =
                [&impl](const transport::Pipe& pipe, transport::Message m) {
                  impl.on_reply(pipe, std::move(m));
                },
            .is_error_reply =
                [](const Impl::Reply& reply) {
                  return reply->type() == tr::MessageType::EXCEPTION;
                },
        },
        std::move(worker_thread_init));
    impl.rendezvous(rank);
  } catch (const Error& e) {
    // Bad options, a group that does not form: as torch's own checks fail.
    impl.stop();
    TORCH_CHECK(false, e.what());
  } catch (...) {
    impl.stop();
    throw;
  }
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
  const tr::WorkerInfo* w = impl_->peers.find(worker_name);
  TORCH_CHECK(
      w != nullptr,
      fmt::format(
          "name:{},rank:{} could not find destination name {}",
          workerInfo_.name_,
          workerInfo_.id_,
          worker_name));
  return *w;
}

const tr::WorkerInfo& Agent::getWorkerInfo(tr::worker_id_t id) const {
  const tr::WorkerInfo* w = impl_->peers.find(static_cast<int>(id));
  TORCH_CHECK(
      w != nullptr,
      fmt::format(
          "name:{},rank:{} could not find destination id {}",
          workerInfo_.name_,
          workerInfo_.id_,
          id));
  return *w;
}

std::vector<tr::WorkerInfo> Agent::getWorkerInfos() const {
  return impl_->peers.all();
}

void Agent::join(bool shutdown, float /*timeout*/) {
  Impl& impl = *impl_;
  // Holds until no worker has a call in flight, nested and follow-up calls
  // included (each served request answers a call some worker counts).
  auto timeout = impl.store->default_timeout();
  impl.barrier->drain(
      [&] {
        impl.client_active.wait_idle(
            std::chrono::steady_clock::time_point::max());
      },
      [&] { return impl.client_active.count(); },
      timeout);
  if (shutdown) {
    impl.barrier->sum(0, timeout);
    // Rank 0 hosts the store (tcp:// and env://): it leaves last, once
    // every worker has read the last round, so that none finds the store
    // gone ("Connection reset by peer").
    impl.barrier->leave(workerInfo_.id_ == 0, timeout);
  }
}

void Agent::startImpl() {
  Impl& impl = *impl_;
  impl.serving.store(true);
  impl.gate.open(
      [&impl](const transport::Pipe& pipe, transport::Message m) {
        impl.serve_on_pool(pipe, std::move(m));
      },
      impl.name());
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
      std::to_string(threads - static_cast<int>(impl.workers().busy()));
  {
    std::lock_guard lock(impl.count_mutex);
    m["agent.client_active_calls"] = std::to_string(impl.client_active.count());
    m["agent.server_active_calls"] = std::to_string(impl.server_active);
    m["agent.server_active_async_calls"] = std::to_string(impl.server_async);
  }
  if (isGILProfilingEnabled()) {
    std::lock_guard lock(impl.gil_mutex);
    m["agent.gil_average_wait_time_us"] = std::to_string(
        impl.gil_waits == 0 ? 0.0 : impl.gil_wait_us_sum / impl.gil_waits);
  }
  auto stats = impl.transport().stats();
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
  return impl_->transport().connection_kind(getWorkerInfo(worker).id_);
}

const AgentOptions& Agent::options() const {
  return impl_->options;
}

}  // namespace tide::torch_rpc
