#include "tide/autograd/dist_autograd.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ops/ones_like.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include "tide/autograd/optimizer.h"
#include "tide/common/error.h"
#include "tide/common/future.h"
#include "tide/common/logging.h"
#include "tide/rpc/tensor.h"

#include "rpc/extensions.h"

// Distributed autograd on libtorch's public autograd API (FAST mode, as
// torch's; docs/rpc.md and docs/rpc-protocol.md say what travels). Each
// worker runs libtorch's engine once per arriving gradient message, from
// the edges the matching send recorded, capturing what reaches leaves
// (into the context) and recv functions (sent on). Backward is linear in
// the incoming gradients, so the sum over runs is the gradient; a run only
// waits for what it sent, so nothing waits for a tensor the loss never
// used.
namespace tide::rpc::dist_autograd {
namespace {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

constexpr const char* kBackwardFn = "tide.autograd.backward";
constexpr const char* kReleaseFn = "tide.autograd.release";

// Which message of a call: its arguments (caller to callee) or its result.
enum Direction : int { kArguments = 0, kResult = 1 };
using MessageKey = std::pair<uint64_t, int>;

// The grad_fn of the tensors requiring grad one message brought: what
// reaches it goes back to worker `from`, to the send function of `key`.
// Never runs: a backward pass captures its inputs.
class RecvBackward : public Node {
 public:
  RecvBackward(int from, MessageKey key) : from_(from), key_(key) {}

  variable_list apply(variable_list&& /*grads*/) override {
    throw InternalError("tide's RecvBackward ran instead of being captured");
  }
  std::string name() const override {
    return "tide::rpc::RecvBackward";
  }
  int from() const {
    return from_;
  }
  MessageKey key() const {
    return key_;
  }

 private:
  const int from_;
  const MessageKey key_;
};

struct ContextData {
  explicit ContextData(int64_t i) : id(i) {}

  const int64_t id;
  std::mutex mutex;
  // Guarded by mutex: the edges of the tensors requiring grad each message
  // sent from here carried, in their order on the wire; the workers this
  // context's calls went to; the gradients of leaves, by the leaf.
  std::map<MessageKey, edge_list> sends;
  std::set<int> known;
  // The workers whose calls carried this context here: with `known` and
  // the worker that made it, the only ones that may release it here.
  std::set<int> callers;
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>>
      grads;
};

// One agent's contexts (its extension, rpc.h).
struct AgentState : detail::AgentExtension {
  explicit AgentState(RpcAgent& a) : agent(&a), self(a.get_worker_info().id) {
    for (const auto& w : a.worker_infos()) {
      names.push_back(w.name);
    }
  }

  RpcAgent* const agent;  // Usable while !closed.
  const int self;
  std::vector<std::string> names;  // by worker id
  std::atomic<uint64_t> next_context{0};
  std::atomic<uint64_t> next_message{0};

  std::mutex mutex;
  std::map<int64_t, std::shared_ptr<ContextData>> contexts;  // Guarded.
  // The releases of contexts this worker ended, until they are answered
  // (each completes, failures logged, once its retries are over).
  std::vector<Future<void>> releasing;  // Guarded.
  bool closed = false;                  // Guarded.

  void close() override {
    std::lock_guard lock(mutex);
    closed = true;
    contexts.clear();
  }

  // Ids as torch makes them: the worker in the top 16 bits.
  uint64_t make_id(std::atomic<uint64_t>& counter) {
    constexpr uint64_t kLow = (uint64_t{1} << 48) - 1;
    return (static_cast<uint64_t>(self) << 48) | (counter.fetch_add(1) & kLow);
  }
  const std::string& name_of(int id) const {
    static const std::string kUnknown = "?";
    return id >= 0 && static_cast<size_t>(id) < names.size()
               ? names[static_cast<size_t>(id)]
               : kUnknown;
  }

  std::shared_ptr<ContextData> find(int64_t id, bool make) {
    std::lock_guard lock(mutex);
    if (closed) {
      throw NetworkError("the rpc agent is shut down");
    }
    auto it = contexts.find(id);
    if (it != contexts.end()) {
      return it->second;
    }
    if (!make) {
      return nullptr;
    }
    // Each is released at the end of its backward pass: this many alive at
    // once is a peer making them faster than it releases them.
    constexpr size_t kMaxContexts = 65'536;
    if (contexts.size() >= kMaxContexts) {
      throw Error(
          "worker '" + name_of(self) + "' holds " +
          std::to_string(contexts.size()) +
          " distributed autograd contexts already; release them "
          "(dist_autograd::Context ends them) before making more");
    }
    auto ctx = std::make_shared<ContextData>(id);
    contexts.emplace(id, ctx);
    return ctx;
  }
  std::shared_ptr<ContextData> take(int64_t id) {
    std::lock_guard lock(mutex);
    auto it = contexts.find(id);
    if (it == contexts.end()) {
      return nullptr;
    }
    auto ctx = std::move(it->second);
    contexts.erase(it);
    return ctx;
  }
  // The agent, unless it stopped.
  RpcAgent* open_agent() {
    std::lock_guard lock(mutex);
    return closed ? nullptr : agent;
  }
};

// Every agent's state, for finding a context by its id alone.
struct States {
  std::mutex mutex;
  std::vector<std::weak_ptr<AgentState>> all;  // Guarded by mutex.
};
States& states() {
  static States s;
  return s;
}

std::shared_ptr<AgentState> state_of(RpcAgent& agent) {
  enable();
  return std::static_pointer_cast<AgentState>(
      detail::agent_extension(agent, [&agent] {
        auto state = std::make_shared<AgentState>(agent);
        auto& s = states();
        std::lock_guard lock(s.mutex);
        std::erase_if(s.all, [](const auto& w) { return w.expired(); });
        s.all.push_back(state);
        return state;
      }));
}

// The context this thread is in: its own (Context) or that of the call it
// serves.
struct Current {
  std::shared_ptr<AgentState> state;
  std::shared_ptr<ContextData> context;
};
thread_local Current t_current;

// Leaves this thread out of any context for its lifetime: the messages of
// the backward pass and of cleanup are not themselves recorded.
class NoContext {
 public:
  NoContext() : saved_(std::exchange(t_current, {})) {}
  ~NoContext() {
    t_current = std::move(saved_);
  }
  NoContext(const NoContext&) = delete;
  NoContext& operator=(const NoContext&) = delete;

 private:
  Current saved_;
};

// What the tensor codec reports of one call, on either side.
class CallGrads : public detail::TensorGrads {
 public:
  CallGrads(
      std::shared_ptr<AgentState> state,
      std::shared_ptr<ContextData> context,
      uint64_t message,
      int peer,
      bool caller)
      : TensorGrads(static_cast<uint64_t>(context->id), message),
        state_(std::move(state)),
        context_(std::move(context)),
        peer_(peer),
        caller_(caller) {}

  void sent(const at::Tensor& t) override {
    Edge edge = torch::autograd::impl::gradient_edge(t);
    std::lock_guard lock(context_->mutex);
    context_->sends[{message_id(), caller_ ? kArguments : kResult}].push_back(
        std::move(edge));
  }
  void received(at::Tensor& t) override {
    if (!recv_) {
      recv_ = std::make_shared<RecvBackward>(
          peer_, MessageKey{message_id(), caller_ ? kResult : kArguments});
    }
    torch::autograd::set_history(t, recv_);
  }
  void enter() override {
    saved_ = std::exchange(t_current, Current{state_, context_});
  }
  void leave() override {
    t_current = std::move(saved_);
  }

 private:
  const std::shared_ptr<AgentState> state_;
  const std::shared_ptr<ContextData> context_;
  const int peer_;
  const bool caller_;
  std::shared_ptr<RecvBackward> recv_;
  Current saved_;
};

struct Hooks : detail::AutogradHooks {
  detail::GradsPtr call(RpcAgent& agent, int to) override {
    const Current& c = t_current;
    if (!c.context || c.state->agent != &agent) {
      return nullptr;
    }
    {
      std::lock_guard lock(c.context->mutex);
      c.context->known.insert(to);
    }
    return std::make_shared<CallGrads>(
        c.state, c.context, c.state->make_id(c.state->next_message), to, true);
  }
  detail::GradsPtr serve(
      RpcAgent& agent, int from, uint64_t context, uint64_t message) override {
    auto state = state_of(agent);
    auto ctx = state->find(static_cast<int64_t>(context), true);
    {
      std::lock_guard lock(ctx->mutex);
      ctx->callers.insert(from);
    }
    return std::make_shared<CallGrads>(
        std::move(state), std::move(ctx), message, from, false);
  }
};

// The edges where a run from `roots` ends: every leaf's accumulator and
// every input of every recv function it reaches.
edge_list ends_of(const edge_list& roots) {
  edge_list ends;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> todo;
  for (const Edge& e : roots) {
    if (e.is_valid() && seen.insert(e.function.get()).second) {
      todo.push_back(e.function.get());
    }
  }
  while (!todo.empty()) {
    Node* node = todo.back();
    todo.pop_back();
    if (dynamic_cast<AccumulateGrad*>(node) != nullptr) {
      ends.emplace_back(node->shared_from_this(), 0);
      continue;
    }
    if (dynamic_cast<RecvBackward*>(node) != nullptr) {
      for (uint32_t i = 0; i < node->num_inputs(); ++i) {
        ends.emplace_back(node->shared_from_this(), i);
      }
      continue;
    }
    for (const Edge& next : node->next_edges()) {
      if (next.is_valid() && seen.insert(next.function.get()).second) {
        todo.push_back(next.function.get());
      }
    }
  }
  return ends;
}

bool is_end(const Edge& e) {
  return dynamic_cast<AccumulateGrad*>(e.function.get()) != nullptr ||
         dynamic_cast<RecvBackward*>(e.function.get()) != nullptr;
}

// One run of this worker's graph from `roots` with `grads`: the gradients
// reaching leaves are added to the context, those reaching recv functions
// are sent back where their tensors came from. Completes when every worker
// they went to has finished its share.
Future<void> run_graph(
    const std::shared_ptr<AgentState>& state,
    const std::shared_ptr<ContextData>& ctx,
    const edge_list& roots,
    const variable_list& grads,
    bool retain_graph) {
  NoContext outside;
  // Gradients at the ends, each with its edge. A root that is an end
  // itself (a leaf sent as it is, a received tensor sent straight back)
  // needs no engine.
  std::vector<std::pair<Edge, at::Tensor>> at_ends;
  edge_list engine_roots;
  variable_list engine_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].is_valid() || !grads[i].defined()) {
      continue;
    }
    if (is_end(roots[i])) {
      at_ends.emplace_back(roots[i], grads[i]);
    } else {
      engine_roots.push_back(roots[i]);
      engine_grads.push_back(grads[i]);
    }
  }
  if (!engine_roots.empty()) {
    edge_list ends = ends_of(engine_roots);
    // keep_graph: another message of this pass, or another pass, may run
    // through the same nodes; the graph goes with the context.
    variable_list got = torch::autograd::Engine::get_default_engine().execute(
        engine_roots,
        engine_grads,
        /*keep_graph=*/true,
        /*create_graph=*/false,
        /*accumulate_grad=*/false,
        ends);
    for (size_t i = 0; i < ends.size(); ++i) {
      if (got[i].defined()) {
        at_ends.emplace_back(ends[i], got[i]);
      }
    }
  }
  // Each recv function's gradients, by input; undefined where none came.
  std::map<RecvBackward*, std::pair<std::shared_ptr<Node>, variable_list>>
      to_send;
  {
    std::lock_guard lock(ctx->mutex);
    for (auto& [edge, grad] : at_ends) {
      if (auto* acc = dynamic_cast<AccumulateGrad*>(edge.function.get())) {
        const at::Tensor& leaf = acc->variable;
        auto [it, fresh] =
            ctx->grads.try_emplace(leaf.unsafeGetTensorImpl(), leaf, grad);
        if (!fresh) {
          it->second.second = it->second.second + grad;
        }
        continue;
      }
      auto* recv = static_cast<RecvBackward*>(edge.function.get());
      auto& [node, inputs] = to_send[recv];
      if (!node) {
        node = edge.function;
        inputs.resize(recv->num_inputs());
      }
      at::Tensor& slot = inputs[edge.input_nr];
      slot = slot.defined() ? slot + grad : grad;
    }
  }
  std::vector<Future<void>> sent;
  for (auto& [recv, entry] : to_send) {
    auto [message, direction] = recv->key();
    sent.push_back(state->agent->rpc_async<void>(
        state->name_of(recv->from()),
        kBackwardFn,
        ctx->id,
        message,
        direction,
        entry.second,
        retain_graph));
  }
  return when_all(std::move(sent));
}

// A gradient message: runs this worker's graph from the send it names.
Future<void> on_backward(
    int64_t context_id,
    uint64_t message,
    int direction,
    std::vector<at::Tensor> grads,
    bool retain_graph) {
  auto state = state_of(current_agent());
  auto ctx = state->find(context_id, false);
  const std::string& self = state->name_of(state->self);
  if (!ctx) {
    throw InvalidArgument(
        "no distributed autograd context " + std::to_string(context_id) +
        " on worker '" + self + "' (it ended, or never reached this worker)");
  }
  edge_list roots;
  {
    std::lock_guard lock(ctx->mutex);
    auto it = ctx->sends.find({message, direction});
    if (it == ctx->sends.end()) {
      throw InvalidArgument(
          "worker '" + self + "' sent no tensor requiring grad in message " +
          std::to_string(message) + " of context " +
          std::to_string(context_id));
    }
    roots = it->second;
  }
  if (grads.size() != roots.size()) {
    throw InvalidArgument(
        "message " + std::to_string(message) + " carried " +
        std::to_string(roots.size()) + " tensors requiring grad, but " +
        std::to_string(grads.size()) + " gradients came back");
  }
  return run_graph(state, ctx, roots, grads, retain_graph);
}

void log_release_failure(
    const AgentState& state, int to, int64_t id, const std::exception& e) {
  TIDE_LOG_WARN(
      "[{}] could not release distributed autograd context {} on worker "
      "'{}': {}",
      state.name_of(state.self),
      id,
      state.name_of(to),
      e.what());
}

// Sends the release of context `id` to worker `to` (idempotent: with the
// rpc layers' retry); the returned future completes then, a failure logged
// (a context a lost worker held is gone with it).
Future<void> send_release(
    const std::shared_ptr<AgentState>& state, int to, int64_t id) {
  RpcAgent* agent = state->open_agent();
  if (agent == nullptr) {
    return Future<void>::make_ready();
  }
  std::string args;
  {
    Encoder e(args);
    encode_args(e, id);
  }
  Promise<void> done;
  detail::control_call(*agent, to, kReleaseFn, std::move(args))
      .on_complete([state, to, id, done](const Future<void>& r) mutable {
        if (std::exception_ptr error = r.error()) {
          try {
            std::rethrow_exception(error);
          } catch (const NetworkError& e) {
            // Lost: the context went with the worker.
            TIDE_LOG_DEBUG(
                "[{}] context {} not released on '{}': {}",
                state->name_of(state->self),
                id,
                state->name_of(to),
                e.what());
          } catch (const std::exception& e) {
            log_release_failure(*state, to, id, e);
          }
        }
        done.set_value();
      });
  return done.get_future();
}

// Drops `ctx` (already out of the books) on every worker it reached.
Future<void> release_everywhere(
    const std::shared_ptr<AgentState>& state,
    const std::shared_ptr<ContextData>& ctx) {
  std::set<int> known;
  {
    std::lock_guard lock(ctx->mutex);
    known = ctx->known;
  }
  std::vector<Future<void>> acks;
  for (int to : known) {
    if (to == state->self) {
      continue;
    }
    acks.push_back(send_release(state, to, ctx->id));
  }
  return when_all(std::move(acks));
}

Future<void> on_release(int64_t context_id, int caller) {
  auto state = state_of(current_agent());
  if (auto ctx = state->find(context_id, false)) {
    std::lock_guard lock(ctx->mutex);
    bool part =
        ctx->known.count(caller) > 0 || ctx->callers.count(caller) > 0 ||
        static_cast<int>(static_cast<uint64_t>(context_id) >> 48) == caller;
    if (!part) {
      throw InvalidArgument(
          "worker " + std::to_string(caller) +
          " asked to release distributed autograd context " +
          std::to_string(context_id) + ", in which it has no part");
    }
  }
  auto ctx = state->take(context_id);
  if (!ctx) {
    return Future<void>::make_ready();  // released already (a cycle)
  }
  return release_everywhere(state, ctx);
}

Hooks g_hooks;

[[maybe_unused]] const bool g_enabled = (enable(), true);

}  // namespace

void enable() {
  static const bool kOnce = [] {
    detail::register_global_function(kBackwardFn, &on_backward);
    // With the caller, which must have a part in the context.
    detail::register_global_handler(
        kReleaseFn, [](Decoder& d, std::string_view fn) -> detail::Invocation {
          auto [id] = decode_args<std::tuple<int64_t>>(d, fn);
          int caller = d.caller();
          return [id = id, caller] {
            return detail::run_to_value<Future<void>>(
                [&] { return on_release(id, caller); });
          };
        });
    detail::register_optimizer_functions();
    detail::set_autograd_hooks(&g_hooks);
    return true;
  }();
  (void)kOnce;
}

Context::Context() : Context(current_agent()) {}

Context::Context(RpcAgent& agent) {
  if (t_current.context) {
    throw InvalidArgument(
        "this thread is in distributed autograd context " +
        std::to_string(t_current.context->id) +
        " already; contexts do not nest");
  }
  auto state = state_of(agent);
  id_ = static_cast<int64_t>(state->make_id(state->next_context));
  t_current = Current{state, state->find(id_, true)};
  state_ = state;
}

Context::~Context() {
  auto state = std::static_pointer_cast<AgentState>(state_);
  t_current = {};
  auto ctx = state->take(id_);
  if (!ctx || state->open_agent() == nullptr) {
    return;
  }
  // Not waited for (as torch's): the next step need not pay a round trip.
  Future<void> done = release_everywhere(state, ctx);
  std::lock_guard lock(state->mutex);
  std::erase_if(state->releasing, [](const auto& f) { return f.ready(); });
  state->releasing.push_back(std::move(done));
}

void wait_for_releases(RpcAgent& agent) {
  auto state = state_of(agent);
  std::vector<Future<void>> pending;
  {
    std::lock_guard lock(state->mutex);
    pending.swap(state->releasing);
  }
  agent.wait(when_all(std::move(pending)), std::chrono::milliseconds(0));
}

int64_t current_context_id() {
  return t_current.context ? t_current.context->id : -1;
}

namespace {

// Context `id` and its agent's state: the thread's current context when
// that is the one asked for; else the context of that id of this process's
// agents (with several agents in one process, the one serving this thread
// or, failing that, the context's creator).
std::pair<std::shared_ptr<AgentState>, std::shared_ptr<ContextData>>
context_for(int64_t id) {
  if (t_current.context && t_current.context->id == id) {
    return {t_current.state, t_current.context};
  }
  RpcAgent* serving = nullptr;
  try {
    serving = &current_agent();
  } catch (const InvalidArgument&) {
  }
  std::vector<std::shared_ptr<AgentState>> all;
  {
    auto& s = states();
    std::lock_guard lock(s.mutex);
    for (const auto& w : s.all) {
      if (auto state = w.lock()) {
        all.push_back(std::move(state));
      }
    }
  }
  std::pair<std::shared_ptr<AgentState>, std::shared_ptr<ContextData>> best;
  for (auto& state : all) {
    std::shared_ptr<ContextData> ctx;
    try {
      ctx = state->find(id, false);
    } catch (const NetworkError&) {
      continue;  // a stopped agent
    }
    if (!ctx) {
      continue;
    }
    if (state->agent == serving || !best.first ||
        (best.first->agent != serving && state->self == (id >> 48))) {
      best = {state, ctx};
    }
  }
  if (!best.first) {
    throw InvalidArgument(
        "no distributed autograd context " + std::to_string(id) +
        " on this worker (it ended, or never reached it)");
  }
  return best;
}

}  // namespace

void backward(
    int64_t context_id,
    const std::vector<at::Tensor>& roots,
    bool retain_graph) {
  if (roots.empty()) {
    throw InvalidArgument("dist_autograd::backward needs at least one root");
  }
  edge_list edges;
  variable_list grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& r = roots[i];
    std::string which = "root " + std::to_string(i) + " of backward";
    if (!r.defined() || !r.requires_grad()) {
      throw InvalidArgument(which + " does not require grad");
    }
    if (r.numel() != 1) {
      throw InvalidArgument(
          which + " has " + std::to_string(r.numel()) +
          " elements; roots must be scalars");
    }
    if (!r.grad_fn()) {
      throw InvalidArgument(
          which + " is a leaf; roots must be results of operations");
    }
    edges.push_back(torch::autograd::impl::gradient_edge(r));
    grads.push_back(at::ones_like(r));
  }
  auto [state, ctx] = context_for(context_id);
  Future<void> done = run_graph(state, ctx, edges, grads, retain_graph);
  state->agent->wait(done, std::chrono::milliseconds(0));
}

Gradients get_gradients(int64_t context_id) {
  auto [state, ctx] = context_for(context_id);
  Gradients out;
  std::lock_guard lock(ctx->mutex);
  for (const auto& [impl, entry] : ctx->grads) {
    out.index_.emplace(impl, out.entries_.size());
    out.entries_.push_back(entry);
  }
  return out;
}

void zero_gradients(int64_t context_id, const std::vector<at::Tensor>& leaves) {
  auto [state, ctx] = context_for(context_id);
  std::lock_guard lock(ctx->mutex);
  if (leaves.empty()) {
    ctx->grads.clear();
  }
  for (const at::Tensor& leaf : leaves) {
    ctx->grads.erase(leaf.unsafeGetTensorImpl());
  }
}

size_t num_contexts(RpcAgent& agent) {
  auto state = state_of(agent);
  std::lock_guard lock(state->mutex);
  return state->contexts.size();
}

}  // namespace tide::rpc::dist_autograd
