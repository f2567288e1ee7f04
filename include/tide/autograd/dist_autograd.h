#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tide/rpc/rpc.h"

// Distributed autograd: the backward pass follows a forward pass that
// crossed rpc boundaries (torch.distributed.autograd, FAST mode). Link
// libtide_autograd and libtorch.
//
//   {
//     dist_autograd::Context ctx;
//     at::Tensor h = local(x);                            // here
//     at::Tensor y = stage.forward<at::Tensor>(h);        // on worker1
//     at::Tensor loss = y.sum();
//     dist_autograd::backward(ctx.context_id(), {loss});  // back to worker1
//     optimizer.step(ctx.context_id());                   // optimizer.h
//   }  // the context ends here and on every worker that took part
//
// Inside a context, every rpc of this thread (rpc_sync, rpc_async,
// remote, to_here, the proxies, RemoteModule::forward) carries the
// context's id. Its tensors requiring grad are recorded where they leave
// (a send function whose next edges are the tensors' own) and where they
// arrive (a recv function becomes their grad_fn), in both directions: the
// arguments and the result. The callee runs the function inside the same
// context, so its own calls are recorded too; a worker makes the context
// when the first call of it arrives.
//
// backward(id, roots) runs the local graph from the roots with libtorch's
// engine. The gradients that reach a recv function are sent to the worker
// the tensors came from, which runs its graph from the matching send
// function, and so on; backward returns when every worker the gradients
// reached has finished. A gradient that reaches a leaf is added to the
// context's gradients on that worker (get_gradients()); `.grad` is never
// written. A tensor sent but not used by the loss gets no gradient and
// holds nothing up: no gradient is shipped for it.
//
// Errors: the error of any worker's part fails backward() on the initiator,
// as a RemoteError naming every worker on the way (or NetworkError when a
// worker it sent gradients to is lost, at once, not after a timeout).
namespace tide::rpc::dist_autograd {

// Makes distributed autograd part of this process's rpc agents. Every
// function below does it; a worker that only serves calls made inside
// contexts, and uses nothing of this header, calls it before its agent
// starts, or its agent refuses such calls.
void enable();

// A distributed autograd context of this thread (torch's
// `with dist_autograd.context()`): made by the process's agent (or
// `agent`), current on this thread until destroyed; one at a time per
// thread. Its destructor drops it here at once and sends its release to
// every worker it reached (each passes it on), without waiting for them;
// wait_for_releases() waits.
class Context {
 public:
  Context();
  explicit Context(RpcAgent& agent);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Unique in the group: the worker's id in the top 16 bits.
  int64_t context_id() const {
    return id_;
  }

 private:
  int64_t id_ = -1;
  std::shared_ptr<void> state_;
};

// The id of this thread's current context: its own Context's or, inside a
// function that a call made in a context runs, that context's; -1 when
// there is none.
int64_t current_context_id();

// Runs the backward pass of context `context_id` (of this worker) from
// `roots`: scalar tensors requiring grad, each the result of an operation
// (not a leaf). retain_graph is accepted for torch's sake: tide keeps each
// worker's graph until the context ends, so another backward over it works
// either way. Throws InvalidArgument for bad roots or an unknown context,
// and the errors the top of this file lists.
void backward(
    int64_t context_id,
    const std::vector<at::Tensor>& roots,
    bool retain_graph = false);

// The gradients a context accumulated on this worker, by the leaf tensor
// they belong to (its identity, not its value).
class Gradients {
 public:
  // The gradient of `tensor`; an undefined tensor when it has none.
  at::Tensor at(const at::Tensor& tensor) const {
    auto it = index_.find(tensor.unsafeGetTensorImpl());
    return it == index_.end() ? at::Tensor() : entries_[it->second].second;
  }
  bool contains(const at::Tensor& tensor) const {
    return index_.contains(tensor.unsafeGetTensorImpl());
  }
  size_t size() const {
    return entries_.size();
  }
  // (leaf, gradient) pairs, in no particular order.
  const std::vector<std::pair<at::Tensor, at::Tensor>>& entries() const {
    return entries_;
  }

 private:
  friend Gradients get_gradients(int64_t);
  std::vector<std::pair<at::Tensor, at::Tensor>> entries_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_;
};

// The gradients context `context_id` holds here (the context must exist
// on this worker; InvalidArgument otherwise). The tensors are the
// context's: a later backward in the context adds to new ones.
Gradients get_gradients(int64_t context_id);

// Drops the gradients of `leaves` (all of them when empty) from context
// `context_id` here.
void zero_gradients(
    int64_t context_id, const std::vector<at::Tensor>& leaves = {});

// The contexts `agent` holds now (its own and those calls brought).
size_t num_contexts(RpcAgent& agent);

// Waits until every worker has answered the releases of the contexts
// `agent`'s threads ended so far (a release a worker does not answer is
// retried after a timeout, then logged). Throws TimeoutError after the
// agent's rpc_timeout and 30 s more.
void wait_for_releases(RpcAgent& agent);

}  // namespace tide::rpc::dist_autograd
