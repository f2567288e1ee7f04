#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/rpc/rpc.h"
#include "tide/store/store.h"

#include "common/demangle.h"
#include "rpc/calls.h"
#include "rpc/extensions.h"
#include "rpc/messages.h"
#include "rpc/options.h"
#include "rpc/rrefs.h"
#include "rpc_core/call_metrics.h"
#include "rpc_core/endpoint.h"
#include "rpc_core/in_flight.h"
#include "rpc_core/peer_group.h"
#include "rpc_core/peer_table.h"
#include "rpc_core/request_gate.h"
#include "transport/fields.h"
#include "transport/transport.h"
#include "transport/workers.h"

namespace tide::rpc {

namespace {

using std::chrono::milliseconds;

// tide's store as the group meets through it.
class GroupStoreOf : public rpc_core::GroupStore {
 public:
  explicit GroupStoreOf(std::shared_ptr<store::Store> store)
      : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, value);
  }
  std::string compare_set(
      const std::string& key,
      const std::string& expected,
      const std::string& desired) override {
    return store_->compare_set(key, expected, desired);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return store_->add(key, delta);
  }
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override {
    store_->wait(keys, timeout);
  }
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override {
    return store_->multi_get(keys);
  }

 private:
  std::shared_ptr<store::Store> store_;
};

struct GlobalRegistry {
  std::mutex mutex;
  std::map<std::string, detail::Handler> handlers;  // Guarded by mutex.
};

GlobalRegistry& global_registry() {
  static GlobalRegistry r;
  return r;
}

}  // namespace

namespace detail {

bool register_global_handler(const std::string& name, Handler handler) {
  auto& r = global_registry();
  std::lock_guard lock(r.mutex);
  r.handlers[name] = std::move(handler);
  return true;
}

}  // namespace detail

// The agent whose function this thread is running (current_agent()).
thread_local RpcAgent* t_serving = nullptr;

struct RpcAgent::Impl {
  RpcAgent* agent = nullptr;
  WorkerInfo self;
  int world_size = 0;
  RpcBackendOptions options;
  std::unique_ptr<GroupStoreOf> store;
  std::unique_ptr<rpc_core::GroupBarrier> barrier;
  rpc_core::PeerTable<WorkerInfo> peers;

  std::mutex handlers_mutex;
  std::map<std::string, detail::Handler> handlers;  // Guarded by it.

  // The endpoint (declared last, destroyed first) reports to these until
  // its threads end.
  std::unique_ptr<detail::Calls> calls;
  std::shared_ptr<detail::RRefBooks> books;
  // Run the continuations of the futures rpc_async and RRef calls return,
  // on the endpoint's completion threads; futures may hold it past the
  // agent.
  std::shared_ptr<Executor> continuations;

  transport::Transport& transport() {
    return endpoint->transport();
  }
  transport::Workers& workers() {
    return endpoint->workers();
  }
  void run_on_pool(std::function<void()> fn) {
    workers().run(std::move(fn));
  }

  // Functions running here; the shutdown barrier waits for none. Shared:
  // an async function may complete after the agent is gone.
  std::shared_ptr<rpc_core::InFlight> running =
      std::make_shared<rpc_core::InFlight>();

  std::mutex extension_mutex;
  std::shared_ptr<detail::AgentExtension> extension;  // Guarded by it.

  std::mutex shutdown_mutex;
  bool shut_down = false;  // Guarded by shutdown_mutex.

  // Opens once this worker knows the group (rendezvous()): a caller may
  // meet the group first.
  rpc_core::RequestGate gate;

  // Last, so that it goes first: its threads use everything above until
  // they are joined.
  std::unique_ptr<rpc_core::Endpoint<transport::Message>> endpoint;

  detail::Handler find_handler(const std::string& fn) {
    {
      std::lock_guard lock(handlers_mutex);
      if (auto it = handlers.find(fn); it != handlers.end()) {
        return it->second;
      }
    }
    auto& r = global_registry();
    std::lock_guard lock(r.mutex);
    if (auto it = r.handlers.find(fn); it != r.handlers.end()) {
      return it->second;
    }
    return nullptr;
  }

  // The function called `fn`; InvalidArgument naming those there are.
  detail::Handler handler_for(const std::string& fn) {
    detail::Handler h = find_handler(fn);
    if (!h) {
      throw InvalidArgument(
          "no function '" + fn + "' on worker '" + self.name +
          "'; registered: " + known_functions());
    }
    return h;
  }

  std::string known_functions() {
    std::vector<std::string> names;
    {
      std::lock_guard lock(handlers_mutex);
      for (const auto& [n, h] : handlers) {
        names.push_back(n);
      }
    }
    {
      auto& r = global_registry();
      std::lock_guard lock(r.mutex);
      for (const auto& [n, h] : r.handlers) {
        names.push_back(n);
      }
    }
    std::sort(names.begin(), names.end());
    std::string out;
    for (const auto& n : names) {
      out += (out.empty() ? "" : ", ") + n;
    }
    return out.empty() ? "none" : out;
  }

  // Called on the transport's loop: decodes the arguments and runs the
  // function on the pool, once the RRefs among its arguments are
  // confirmed by their owners.
  Future<detail::Value> on_request(
      int caller,
      std::string fn,
      detail::Payload args,
      detail::GradsPtr grads) {
    if (workers().full()) {
      throw Error(
          rpc_core::busy_refusal(self.name, workers().queued(), fn + "()"));
    }
    Promise<detail::Value> promise;
    Future<detail::Value> result = promise.get_future();
    running->add(1);
    result.on_complete(
        [r = running](const Future<detail::Value>&) { r->add(-1); });
    run_on_pool([this,
                 caller,
                 fn = std::move(fn),
                 args = std::move(args),
                 grads = std::move(grads),
                 promise]() mutable {
      try {
        detail::Handler h = handler_for(fn);
        detail::ArgumentWaits waits;
        detail::MessageContext context = books->context(caller);
        context.grads = grads.get();
        context.waits = &waits;
        Decoder d(args.data.view(), args.buffers);
        d.set_context(&context);
        detail::read_autograd_ids(d);  // on_message read them
        detail::Invocation run = h(d, fn);
        auto start = [this, run = std::move(run), grads, promise]() mutable {
          RpcAgent* outer = std::exchange(t_serving, agent);
          if (grads) {
            grads->enter();
          }
          try {
            // Async functions complete later, on whatever thread completes
            // their future; this worker thread is free now.
            run().on_complete(
                [promise](const Future<detail::Value>& f) mutable {
                  if (auto e = f.error()) {
                    promise.set_exception(e);
                  } else {
                    promise.set_value(f.wait(milliseconds(0)));
                  }
                });
          } catch (...) {
            promise.set_exception(std::current_exception());
          }
          if (grads) {
            grads->leave();
          }
          t_serving = outer;
        };
        std::vector<Future<void>> pending = waits.take();
        if (pending.empty()) {
          start();
        } else {
          // Once the owners confirmed them; on the pool, as start() expects.
          auto go = std::make_shared<decltype(start)>(std::move(start));
          when_all(std::move(pending))
              .on_complete([this, go, promise](const Future<void>& f) mutable {
                if (auto e = f.error()) {
                  promise.set_exception(e);
                } else {
                  run_on_pool([go] { (*go)(); });
                }
              });
        }
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    });
    return result;
  }

  void rendezvous() {
    for (const auto& p : endpoint->meet(
             *store,
             self.id,
             options.listen_host,
             world_size,
             options.rpc_timeout)) {
      peers.add(p.name, WorkerInfo{p.name, p.id});
    }
    gate.open(
        [this](const transport::Pipe& pipe, transport::Message m) {
          serve(pipe, std::move(m));
        },
        self.name);
  }

  size_t outstanding() const {
    return static_cast<size_t>(running->count()) + calls->pending();
  }

  void stop_local() {
    if (books) {
      books->close();
    }
    std::shared_ptr<detail::AgentExtension> ext;
    {
      std::lock_guard lock(extension_mutex);
      ext = extension;
    }
    if (ext) {
      ext->close();
    }
    endpoint->stop("rpc agent '" + self.name + "' is shut down");
  }

  // The autograd record of a call that came inside a distributed autograd
  // context (its payload starts with the context's ids), else null.
  detail::GradsPtr autograd_of(int caller, const detail::Payload& args) {
    Decoder d(args.data.view());
    auto ids = detail::read_autograd_ids(d);
    if (!ids) {
      return nullptr;
    }
    detail::AutogradHooks* hooks = detail::autograd_hooks();
    if (hooks == nullptr) {
      throw InvalidArgument(
          "worker '" + self.name +
          "' got a call made inside a distributed autograd context but has "
          "no distributed autograd: link tide::autograd and call "
          "tide::rpc::dist_autograd::enable() before init_rpc");
    }
    return hooks->serve(*agent, caller, ids->first, ids->second);
  }

  // A request, on the transport's loop: to the pool.
  void on_request(const transport::Pipe& pipe, transport::Message m) {
    if (!gate.hold(pipe, m)) {
      serve(pipe, std::move(m));
    }
  }

  // A request of a worker that knows the group.
  void serve(const transport::Pipe& pipe, transport::Message m) {
    if (m.type == detail::MessageType::kCancel) {
      return;  // Best effort: a running function is not interrupted.
    }
    if (m.type != detail::MessageType::kRequest) {
      throw ProtocolError(
          std::string("unexpected ") +
          detail::rpc_message_types().name(m.type) + " from a caller");
    }
    transport::FieldReader r(m.metadata, "a request");
    std::string fn = r.str();
    r.i64();  // the caller's timeout, in ms
    r.end();
    if (m.buffers.empty()) {
      throw ProtocolError("REQUEST frame without its payload buffer");
    }
    detail::Payload args;
    args.data = std::move(m.buffers[0]);
    args.buffers.assign(
        std::make_move_iterator(m.buffers.begin() + 1),
        std::make_move_iterator(m.buffers.end()));
    uint64_t id = m.id;
    detail::GradsPtr grads;
    Future<detail::Value> result = [&] {
      try {
        books->on_arrival(pipe.peer(), fn, args);
        grads = autograd_of(pipe.peer(), args);
        return on_request(pipe.peer(), fn, std::move(args), grads);
      } catch (...) {
        return Future<detail::Value>::make_failed(std::current_exception());
      }
    }();
    // Completes on a pool thread (or here), which sends the reply itself:
    // no hop through the loop. The pipe drops it once the caller is gone.
    detail::MessageContext context = books->context(pipe.peer());
    context.grads = grads.get();
    result.on_complete([pipe, id, context, grads, fn, self = self.name](
                           const Future<detail::Value>& f) {
      auto describe = [](const std::exception_ptr& error) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          return std::pair<std::string, std::string>(type_name(e), e.what());
        } catch (...) {
          return std::pair<std::string, std::string>(
              "unknown", "a non-standard exception");
        }
      };
      // A caller that does not read what it is sent (its connection is
      // over max_queued_bytes) gets no answer: its call times out.
      auto answer = [&](transport::Message m) {
        try {
          pipe.send(std::move(m));
        } catch (const NetworkError& e) {
          TIDE_LOG_DEBUG(
              "[{}] the answer to {}() was dropped: {}", self, fn, e.what());
        }
      };
      auto send_error = [&](const std::exception_ptr& error) {
        rpc_core::call_served(rpc_core::Outcome::kError);
        auto [type, message] = describe(error);
        answer(transport::Message{
            detail::MessageType::kError,
            id,
            transport::FieldWriter().str(type).str(message).take(),
            {}});
      };
      if (auto error = f.error()) {
        send_error(error);
        return;
      }
      try {
        detail::Value value = f.wait(milliseconds(0));
        if (value.type->encode == nullptr) {
          throw InvalidArgument(
              fn + "() returns a " + std::string(value.type->name) +
              ", which tide cannot serialize (keep it on this worker with "
              "remote())");
        }
        std::string data;
        std::vector<Buffer> buffers;
        Encoder e(data, &buffers);
        e.set_context(&context);
        value.type->encode(e, value.object.get());
        transport::Message reply{detail::MessageType::kResponse, id, {}, {}};
        reply.buffers.reserve(1 + buffers.size());
        reply.buffers.push_back(Buffer(std::move(data)));
        for (auto& b : buffers) {
          reply.buffers.push_back(std::move(b));
        }
        pipe.send(std::move(reply));
        rpc_core::call_served(rpc_core::Outcome::kOk);
      } catch (...) {
        // A result the frame limits refuse: the caller hears why.
        send_error(std::current_exception());
      }
    });
  }

  // Returns once no worker of the group has a call or function in flight.
  void graceful_barrier() {
    milliseconds limit = options.rpc_timeout * 10;
    auto deadline = std::chrono::steady_clock::now() + limit;
    auto wait_idle = [&] {
      // Pending calls complete on the loop without telling: polled.
      if (!running->wait_idle(deadline, [this] {
            return static_cast<int64_t>(calls->pending());
          })) {
        throw TimeoutError(
            "rpc shutdown: worker '" + self.name + "' still has " +
            std::to_string(outstanding()) + " calls or functions after " +
            std::to_string(limit.count()) + " ms");
      }
    };
    barrier->drain(
        wait_idle,
        [this] { return static_cast<int64_t>(outstanding()); },
        limit);
  }
};

RpcAgent::RpcAgent(
    std::string name, int rank, int world_size, RpcBackendOptions options)
    : RpcAgent(
          std::move(name),
          rank,
          world_size,
          options,
          detail::make_store(options, rank)) {}

RpcAgent::RpcAgent(
    std::string name,
    int rank,
    int world_size,
    RpcBackendOptions options,
    std::shared_ptr<store::Store> store)
    : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  if (name.empty()) {
    throw InvalidArgument("an rpc worker needs a non-empty name");
  }
  impl.agent = this;
  impl.self = WorkerInfo{std::move(name), rank};
  impl.world_size = world_size;
  impl.options = detail::with_defaults(std::move(options));
  impl.store = std::make_unique<GroupStoreOf>(std::move(store));
  impl.barrier =
      std::make_unique<rpc_core::GroupBarrier>(*impl.store, world_size);
  try {
    impl.endpoint = std::make_unique<rpc_core::Endpoint<transport::Message>>(
        detail::core_options(impl.options),
        rank,
        impl.self.name,
        detail::rpc_message_types(),
        rpc_core::Endpoint<transport::Message>::Handlers{
            .on_request =
                [&impl](const transport::Pipe& pipe, transport::Message m) {
                  impl.on_request(pipe, std::move(m));
                },
            .on_reply =
                [&impl](const transport::Pipe& pipe, transport::Message m) {
                  impl.calls->on_reply(pipe, std::move(m));
                },
            .on_closed =
                [&impl](const transport::Pipe& pipe, const std::string& why) {
                  impl.books->peer_lost(pipe.peer(), why);
                },
        });
    impl.continuations = std::make_shared<transport::WorkersExecutor>(
        impl.endpoint->completions());
    impl.calls = std::make_unique<detail::Calls>(
        impl.transport(), impl.endpoint->calls());
    impl.books = std::make_shared<detail::RRefBooks>(
        rank,
        world_size,
        *impl.calls,
        [&impl](int id) {
          const WorkerInfo* w = impl.peers.find(id);
          return w ? w->name : std::to_string(id).insert(0, 1, '#');
        },
        impl.options.rpc_timeout);
    impl.books->set_agent(this);
    auto find = [&impl](const std::string& fn) { return impl.handler_for(fn); };
    for (auto& [name, handler] : impl.books->handlers(find)) {
      impl.handlers[name] = std::move(handler);
    }
    impl.rendezvous();
  } catch (...) {
    if (impl.endpoint) {
      impl.stop_local();
    }
    throw;
  }
}

RpcAgent::~RpcAgent() {
  try {
    shutdown(false);
  } catch (const std::exception& e) {
    TIDE_LOG_WARN("[{}] rpc shutdown failed: {}", impl_->self.name, e.what());
  }
}

const WorkerInfo& RpcAgent::get_worker_info() const {
  return impl_->self;
}

WorkerInfo RpcAgent::get_worker_info(const std::string& name) const {
  const WorkerInfo* w = impl_->peers.find(name);
  if (w == nullptr) {
    throw InvalidArgument(
        "no rpc worker named '" + name + "'; workers: " + impl_->peers.names());
  }
  return *w;
}

std::vector<WorkerInfo> RpcAgent::worker_infos() const {
  return impl_->peers.all();
}

void RpcAgent::add_handler(const std::string& name, detail::Handler handler) {
  std::lock_guard lock(impl_->handlers_mutex);
  impl_->handlers[name] = std::move(handler);
}

Future<detail::Payload> RpcAgent::call(
    int to, const std::string& fn, milliseconds timeout, detail::Payload args) {
  return impl_->calls->start(
      to, fn, effective_timeout(timeout), std::move(args));
}

detail::MessageContext RpcAgent::message_context(int peer) const {
  return impl_->books->context(peer);
}

RRefReport RpcAgent::rrefs() const {
  return impl_->books->report();
}

RpcAgent::Impl& impl_of(RpcAgent& agent) {
  return *agent.impl_;
}

namespace detail {

RRefPtr rref_remote(
    RpcAgent& agent,
    const std::string& to,
    const std::string& fn,
    milliseconds timeout,
    Payload args,
    const ValueType* type) {
  RpcAgent::Impl& impl = impl_of(agent);
  return impl.books->start_remote(
      agent.get_worker_info(to).id,
      fn,
      timeout.count() > 0 ? timeout : impl.options.rpc_timeout,
      std::move(args),
      type);
}

RRefPtr rref_local(RpcAgent& agent, Value value) {
  return impl_of(agent).books->local(std::move(value));
}

MessageContext message_context(RpcAgent& agent, const std::string& to) {
  return impl_of(agent).books->context(agent.get_worker_info(to).id);
}

std::shared_ptr<AgentExtension> agent_extension(
    RpcAgent& agent,
    const std::function<std::shared_ptr<AgentExtension>()>& make) {
  RpcAgent::Impl& impl = impl_of(agent);
  std::lock_guard lock(impl.extension_mutex);
  if (!impl.extension) {
    impl.extension = make();
  }
  return impl.extension;
}

Future<void> control_call(
    RpcAgent& agent, int to, const std::string& fn, std::string args) {
  return impl_of(agent).books->control(to, fn, std::move(args));
}

const std::shared_ptr<Executor>& continuation_executor(RpcAgent& agent) {
  return impl_of(agent).continuations;
}

}  // namespace detail

void RpcAgent::help_until(const std::function<bool()>& done) {
  impl_->transport().help(done);
}

milliseconds RpcAgent::effective_timeout(milliseconds timeout) const {
  return timeout.count() > 0 ? timeout : impl_->options.rpc_timeout;
}

size_t RpcAgent::num_pending_calls() const {
  return impl_->calls->pending();
}

size_t RpcAgent::num_running_functions() const {
  return static_cast<size_t>(impl_->running->count());
}

size_t RpcAgent::num_idle_threads() const {
  return impl_->workers().threads() - impl_->workers().busy();
}

std::string RpcAgent::transport_to(const std::string& name) const {
  return impl_->transport().connection_kind(get_worker_info(name).id);
}

RpcAgent::TransportStats RpcAgent::transport_stats() const {
  auto s = impl_->transport().stats();
  return {
      s.buffers_via_shm,
      s.bytes_via_shm,
      s.segments,
      s.buffers_returned,
      s.buffers_via_lanes,
      s.bytes_via_lanes};
}

void RpcAgent::shutdown(bool graceful) {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.shutdown_mutex);
  if (impl.shut_down) {
    return;
  }
  impl.shut_down = true;
  std::exception_ptr error;
  std::vector<std::string> leaks;
  if (graceful) {
    try {
      for (auto& what : impl.books->delete_all(impl.options.rpc_timeout)) {
        leaks.push_back(std::move(what));
      }
      impl.graceful_barrier();
      // Every worker has deleted its RRefs: what this one still owns for
      // others leaked.
      for (auto& what : impl.books->leaks()) {
        leaks.push_back(std::move(what));
      }
    } catch (...) {
      error = std::current_exception();
    }
    for (const auto& what : leaks) {
      TIDE_LOG_WARN("[{}] rpc shutdown: {}", impl.self.name, what);
    }
  }
  impl.stop_local();
  if (graceful && !error) {
    // Rank 0 hosts the store: it leaves last, once everyone has read "go".
    try {
      impl.barrier->leave(impl.self.id == 0, impl.options.rpc_timeout);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    std::rethrow_exception(error);
  }
  if (!leaks.empty() && impl.options.fail_on_rref_leak) {
    std::string all;
    for (const auto& what : leaks) {
      all += "\n  " + what;
    }
    throw InternalError(
        "rpc shutdown of worker '" + impl.self.name + "' found " +
        std::to_string(leaks.size()) + " RRef leak(s):" + all);
  }
}

namespace {

std::mutex g_agent_mutex;
std::unique_ptr<RpcAgent> g_agent;  // Guarded by g_agent_mutex.

}  // namespace

RpcAgent& current_agent() {
  if (t_serving != nullptr) {
    return *t_serving;
  }
  std::lock_guard lock(g_agent_mutex);
  if (!g_agent) {
    throw InvalidArgument("rpc is not initialised; call init_rpc() first");
  }
  return *g_agent;
}

void init_rpc(
    const std::string& name,
    int rank,
    int world_size,
    RpcBackendOptions options) {
  std::lock_guard lock(g_agent_mutex);
  if (g_agent) {
    throw InvalidArgument(
        "init_rpc: this process already runs rpc worker '" +
        g_agent->get_worker_info().name + "'; call shutdown() first");
  }
  g_agent = std::make_unique<RpcAgent>(name, rank, world_size, options);
}

void shutdown(bool graceful) {
  RpcAgent* agent = nullptr;
  {
    std::lock_guard lock(g_agent_mutex);
    agent = g_agent.get();
  }
  if (agent == nullptr) {
    return;
  }
  // Still the process's agent while it shuts down: a graceful shutdown
  // serves the calls still coming, and their functions may use the global
  // API (get_worker_info(), rpc_sync, ...).
  agent->shutdown(graceful);
  std::unique_ptr<RpcAgent> gone;
  {
    std::lock_guard lock(g_agent_mutex);
    gone = std::move(g_agent);
  }
}

}  // namespace tide::rpc
