#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/common/error.h"
#include "tide/common/future.h"
#include "tide/rpc/agent.h"
#include "tide/rpc/serialize.h"

// Remote references (torch.distributed.rpc's RRef and remote()).
//
//   // on "ps": the table lives there, under a registered name
//   TIDE_RPC_FUNCTION(make_table, [](int64_t rows) { return Table(rows); });
//   TIDE_RPC_METHOD(Table, lookup, &Table::lookup);
//
//   // on a trainer: returns at once; the owner builds the table
//   RRef<Table> table = rpc::remote<Table>("ps", "make_table", int64_t{1000});
//   auto rows = table.rpc_sync().call<std::vector<float>>("lookup", ids);
//   rpc::rpc_sync<void>("trainer2", "use_table", table);  // pass it on
//
// An RRef is a handle to a value living on its owner. Any worker may hold,
// copy and pass RRefs (as arguments, results, inside containers); the owner
// keeps the value while any worker holds an RRef to it, or it holds one
// itself, and frees it after the last is gone. The protocol is torch's
// (docs/rpc.md#rrefs): the owner learns of every RRef a user holds; a user
// passing an RRef on keeps its own until the owner has confirmed the new
// one; a function receiving an RRef argument runs once its owner has
// confirmed it; the control messages are idempotent and retried, functions
// never are.
//
// Errors, on the RRef's next use (to_here, a proxy call, passing it on):
//   RemoteError     the function that was to make the value threw
//   TimeoutError    its creation timed out, or this use did
//   OwnerLostError  the connection to the owner was lost (it died): every
//                   pending and later use of its RRefs fails at once
//
// Thread safety: an RRef is a value; copies may be used from any thread.
namespace tide::rpc {

// The owner of an RRef was lost (its process died, its connection broke)
// before or while the RRef was used. The message names the owner.
class OwnerLostError : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// An RRef's identity: the worker that made it, and a number unique there
// (torch's GloballyUniqueId). Each user's hold on an RRef, a fork, has an
// identity of the same form.
struct RRefId {
  int32_t worker = -1;
  int64_t local = 0;

  auto operator<=>(const RRefId&) const = default;
  std::string str() const {
    return std::to_string(worker) + ":" + std::to_string(local);
  }
};

// What RpcAgent::rrefs() reports: the RRefs a worker owns and holds (the
// live references of the group are the union over its workers).
struct RRefReport {
  struct Owned {
    RRefId id;
    std::string type;  // "" until the value exists
    // Forks: user RRefs the owner knows of, and the workers holding them.
    std::vector<std::pair<RRefId, std::string>> users;
    bool ready = false;  // the value (or its error) exists
  };
  struct Held {
    RRefId id;
    RRefId fork;
    std::string owner;
    std::string type;
    bool confirmed = false;  // the owner knows of this fork
  };
  std::vector<Owned> owned;
  std::vector<Held> held;
  // Forks this worker passed on that their receivers have not yet had
  // confirmed, and the workers they went to.
  std::vector<std::pair<RRefId, std::string>> passing;
  // Control messages (fork, accept, delete) this worker sent again after a
  // timeout or a broken connection, since it started.
  uint64_t control_retries = 0;

  // One line per entry, for logs.
  std::string str() const;
};

namespace detail {

// One RRef as this process holds it: an owner's handle on its value, or a
// user's fork (src/rpc/rrefs.h).
struct RRefNode;
using RRefPtr = std::shared_ptr<RRefNode>;

// The non-template side of RRef<T> (src/rpc/rref_api.cpp).
RRefId rref_id(const RRefNode& n);
WorkerInfo rref_owner(const RRefNode& n);
bool rref_is_owner(const RRefNode& n);
bool rref_confirmed(const RRefNode& n);
RpcAgent& rref_agent(const RRefNode& n);
// The owner's value: throws InvalidArgument on a user, or when its type is
// not `want`; the creation's error when it failed; waits up to `timeout`
// for a value still being made (TimeoutError).
std::shared_ptr<void> rref_local_value(
    const RRefNode& n,
    const ValueType* want,
    std::chrono::milliseconds timeout);
// A user's copy of the value, encoded (to_here); fails at once when the
// RRef is unusable (creation failed, owner lost).
Future<Payload> rref_fetch(
    const RRefPtr& n, std::chrono::milliseconds timeout, GradRecorder* grads);
// Runs a registered method of the value on the owner (proxies); `call` is
// encode_invoke()'s. The future holds the method's result, encoded.
Future<Payload> rref_invoke(
    const RRefPtr& n, std::chrono::milliseconds timeout, Payload call);
// The same, keeping the result on the owner as a new RRef of type `result`.
RRefPtr rref_invoke_remote(
    const RRefPtr& n,
    std::chrono::milliseconds timeout,
    Payload call,
    const ValueType* result);
// The context of a message to the RRef's owner.
MessageContext rref_context(const RRefNode& n);
// The codec of RRef<T> (tag kRRef): forks the RRef for the message's peer.
void rref_write(Encoder& e, const RRefPtr& n);
RRefPtr rref_read(Decoder& d, const ValueType* want);

// What RRef<T> asks of its agent (rpc_agent.cpp): a new RRef owned by it,
// holding `value`; a remote() call's RRef, owned by `to`, whose value
// `fn(args)` makes there; the context of a message to worker `to`.
RRefPtr rref_local(RpcAgent& agent, Value value);
RRefPtr rref_remote(
    RpcAgent& agent,
    const std::string& to,
    const std::string& fn,
    std::chrono::milliseconds timeout,
    Payload args,
    const ValueType* type);
MessageContext message_context(RpcAgent& agent, const std::string& to);

// A method of T, type-erased: decodes its arguments and returns what runs
// it on the object.
using MethodInvocation = std::function<Future<Value>(void* object)>;
using Method = std::function<MethodInvocation(Decoder&, std::string_view)>;

// The process-wide registry of methods TIDE_RPC_METHOD fills, by the
// type's name and the method's. Thread safe.
bool register_method(std::string_view type, const std::string& name, Method m);

template <typename T, typename R, typename... A>
Method make_method(std::function<R(T&, A...)> raw) {
  auto fn = std::make_shared<std::function<R(T&, A...)>>(std::move(raw));
  return [fn](Decoder& d, std::string_view name) -> MethodInvocation {
    auto args = std::make_shared<std::tuple<std::remove_cvref_t<A>...>>(
        decode_args<std::tuple<A...>>(d, name));
    return [fn, args](void* object) {
      T& self = *static_cast<T*>(object);
      return run_to_value<R>([&] {
        return std::apply(
            [&](auto&&... a) { return (*fn)(self, std::move(a)...); },
            std::move(*args));
      });
    };
  };
}

template <typename T, typename R, typename C, typename... A>
Method make_method(R (C::*method)(A...)) {
  return make_method(std::function<R(T&, A...)>([method](T& self, A... a) {
    return (self.*method)(std::forward<A>(a)...);
  }));
}
template <typename T, typename R, typename C, typename... A>
Method make_method(R (C::*method)(A...) const) {
  return make_method(std::function<R(T&, A...)>([method](T& self, A... a) {
    return (self.*method)(std::forward<A>(a)...);
  }));
}
template <typename T, typename F>
Method make_method(F fn) {
  return make_method(std::function{std::move(fn)});
}

template <typename T, typename F>
bool register_method_of(const std::string& name, F fn) {
  return register_method(type_name<T>(), name, make_method<T>(std::move(fn)));
}

// A proxy call's payload: which RRef, the type its caller expects, the
// method; then the method's arguments.
template <typename... A>
Payload encode_invoke(
    const MessageContext& context,
    const RRefId& id,
    std::string_view type,
    const std::string& method,
    const A&... args) {
  Payload p;
  std::string data;
  Encoder e(data, &p.buffers);
  begin_call(e, context);
  encode_args(e, id.worker, id.local, type, method);
  encode_args(e, args...);
  p.data = Buffer(std::move(data));
  return p;
}

}  // namespace detail

// A reference to a T living on its owner (see the top of this file).
template <typename T>
class RRef {
 public:
  // An RRef to `value`, owned by this worker (the process's agent, or
  // `agent`).
  explicit RRef(T value) : RRef(current_agent(), std::move(value)) {}
  RRef(RpcAgent& agent, T value)
      : node_(detail::rref_local(
            agent, detail::make_value<T>(std::move(value)))) {}
  explicit RRef(detail::RRefPtr node) : node_(std::move(node)) {}

  // A copy of the value: fetched from the owner (timeout 0: the agent's
  // rpc_timeout), or copied on the owner. Throws as the top of this file
  // says.
  T to_here(std::chrono::milliseconds timeout = {}) const {
    return agent().wait(to_here_async(timeout), timeout);
  }
  Future<T> to_here_async(std::chrono::milliseconds timeout = {}) const {
    static_assert(
        Encodable<T>,
        "to_here() copies the value, so T must serialize; use a proxy "
        "(rpc_sync().call) to run its methods on the owner instead");
    if (is_owner()) {
      auto v = std::static_pointer_cast<T>(
          local_value_for(detail::value_type<T>(), timeout));
      return Future<T>::make_ready(*v);
    }
    detail::GradsPtr grads = detail::autograd_call(agent(), owner().id);
    return detail::decode_reply<T>(
        agent(),
        detail::rref_fetch(node_, timeout, grads.get()),
        "to_here",
        detail::rref_context(*node_),
        grads);
  }

  // The value itself, on the owner only (InvalidArgument elsewhere, or for
  // an RRef<T> whose value is not a T). Waits for a value still being made
  // (remote() to this worker) up to the agent's rpc_timeout.
  std::shared_ptr<T> local_value() const {
    return std::static_pointer_cast<T>(
        local_value_for(detail::value_type<T>(), {}));
  }

  WorkerInfo owner() const {
    return detail::rref_owner(*node_);
  }
  std::string owner_name() const {
    return owner().name;
  }
  bool is_owner() const {
    return detail::rref_is_owner(*node_);
  }
  // The owner knows of this RRef (always true on the owner).
  bool confirmed_by_owner() const {
    return detail::rref_confirmed(*node_);
  }
  RRefId id() const {
    return detail::rref_id(*node_);
  }

  // Proxies: run a method of T registered with TIDE_RPC_METHOD on the
  // owner. rref.rpc_sync().call<R>("m", args...) returns its result;
  // rpc_async() a Future<R>; remote() an RRef<R> to the result, kept on the
  // owner. timeout 0 is the agent's rpc_timeout.
  class SyncProxy;
  class AsyncProxy;
  class RemoteProxy;
  SyncProxy rpc_sync(std::chrono::milliseconds timeout = {}) const {
    return SyncProxy(*this, timeout);
  }
  AsyncProxy rpc_async(std::chrono::milliseconds timeout = {}) const {
    return AsyncProxy(*this, timeout);
  }
  RemoteProxy remote(std::chrono::milliseconds timeout = {}) const {
    return RemoteProxy(*this, timeout);
  }

  const detail::RRefPtr& node() const {
    return node_;
  }

 private:
  RpcAgent& agent() const {
    return detail::rref_agent(*node_);
  }
  std::shared_ptr<void> local_value_for(
      const detail::ValueType* want, std::chrono::milliseconds timeout) const {
    return detail::rref_local_value(*node_, want, timeout);
  }
  template <typename... A>
  Payload invoke_payload(
      detail::GradRecorder* grads,
      const std::string& method,
      const A&... args) const {
    detail::MessageContext context = detail::rref_context(*node_);
    context.grads = grads;
    return detail::encode_invoke(
        context, id(), detail::type_name<T>(), method, args...);
  }

  detail::RRefPtr node_;
};

template <typename T>
class RRef<T>::AsyncProxy {
 public:
  AsyncProxy(RRef<T> rref, std::chrono::milliseconds timeout)
      : rref_(std::move(rref)), timeout_(timeout) {}

  template <typename R, typename... A>
  Future<R> call(const std::string& method, const A&... args) const {
    detail::GradsPtr grads =
        detail::autograd_call(rref_.agent(), rref_.owner().id);
    return detail::decode_reply<R>(
        rref_.agent(),
        detail::rref_invoke(
            rref_.node_,
            timeout_,
            rref_.invoke_payload(grads.get(), method, args...)),
        method,
        detail::rref_context(*rref_.node_),
        grads);
  }

 private:
  RRef<T> rref_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
class RRef<T>::SyncProxy {
 public:
  SyncProxy(RRef<T> rref, std::chrono::milliseconds timeout)
      : rref_(std::move(rref)), timeout_(timeout) {}

  template <typename R, typename... A>
  R call(const std::string& method, const A&... args) const {
    return rref_.agent().wait(
        AsyncProxy(rref_, timeout_).template call<R>(method, args...),
        timeout_);
  }

 private:
  RRef<T> rref_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
class RRef<T>::RemoteProxy {
 public:
  RemoteProxy(RRef<T> rref, std::chrono::milliseconds timeout)
      : rref_(std::move(rref)), timeout_(timeout) {}

  template <typename R, typename... A>
  RRef<R> call(const std::string& method, const A&... args) const {
    return RRef<R>(detail::rref_invoke_remote(
        rref_.node_,
        timeout_,
        rref_.invoke_payload(
            detail::autograd_call(rref_.agent(), rref_.owner().id).get(),
            method,
            args...),
        detail::value_type<R>()));
  }

 private:
  RRef<T> rref_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
struct Codec<RRef<T>> {
  static void write(Encoder& e, const RRef<T>& r) {
    detail::rref_write(e, r.node());
  }
  static RRef<T> read(Decoder& d) {
    return RRef<T>(detail::rref_read(d, detail::value_type<T>()));
  }
};

template <typename R, typename... A>
RRef<R> RpcAgent::remote(
    const std::string& to,
    const std::string& fn,
    std::chrono::milliseconds timeout,
    const A&... args) {
  detail::GradsPtr grads = detail::autograd_call(*this, get_worker_info(to).id);
  detail::MessageContext context = detail::message_context(*this, to);
  context.grads = grads.get();
  return RRef<R>(detail::rref_remote(
      *this,
      to,
      fn,
      timeout,
      detail::encode_call(context, args...),
      detail::value_type<R>()));
}

template <typename R, typename... A>
RRef<R> RpcAgent::remote(
    const std::string& to, const std::string& fn, const A&... args) {
  return remote<R>(to, fn, std::chrono::milliseconds(0), args...);
}

// remote() on the process's agent (current_agent()).
template <typename R, typename... A>
RRef<R> remote(const std::string& to, const std::string& fn, const A&... args) {
  return current_agent().remote<R>(to, fn, args...);
}

}  // namespace tide::rpc

// Makes a method of Type callable through RRef<Type> proxies, on every
// agent of the process: TIDE_RPC_METHOD(Table, lookup, &Table::lookup);
// a member function (const or not) or a callable taking Type& first.
#define TIDE_RPC_METHOD(Type, name, ...)                                  \
  [[maybe_unused]] static const bool TIDE_RPC_METHOD_NAME_(__COUNTER__) = \
      ::tide::rpc::detail::register_method_of<Type>(#name, __VA_ARGS__)
#define TIDE_RPC_METHOD_NAME_(n) TIDE_RPC_METHOD_NAME2_(n)
#define TIDE_RPC_METHOD_NAME2_(n) tide_rpc_method_##n##_
