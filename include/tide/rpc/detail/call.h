#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tide/common/future.h"
#include "tide/rpc/serialize.h"

// What the templates of tide/rpc/rpc.h and rref.h expand to: values and
// registered functions type-erased, and a call's payload and reply coded in
// its message context. Not an API: the names may change with any release.
namespace tide::rpc {

class RpcAgent;

namespace detail {

// An encoded value (argument pack or result) and its out-of-band buffers.
using tide::Payload;

// The type of a value a function produced: its name (the compiler's
// spelling) and how to encode it (null when tide cannot serialize it: such
// a value may live on an RRef's owner, and never travels).
struct ValueType {
  std::string_view name;
  void (*encode)(Encoder&, const void*) = nullptr;
};

template <typename T>
const ValueType* value_type() {
  static const ValueType kType = [] {
    ValueType t{type_name<T>()};
    if constexpr (std::is_void_v<T>) {
      t.encode = [](Encoder& e, const void*) { encode(e, std::nullopt); };
    } else if constexpr (Encodable<T>) {
      t.encode = [](Encoder& e, const void* v) {
        encode(e, *static_cast<const T*>(v));
      };
    }
    return t;
  }();
  return &kType;
}

// A value a function produced, type-erased: a call encodes it into its
// reply; remote() keeps it on the owner. A function without a result
// gives an empty object of value_type<void>().
struct Value {
  std::shared_ptr<void> object;
  const ValueType* type = nullptr;
};

template <typename T>
Value make_value(T v) {
  return {std::make_shared<T>(std::move(v)), value_type<T>()};
}

// A registered function, type-erased: decodes its arguments (on the thread
// that reads the message) and returns what runs it (on a worker thread).
using Invocation = std::function<Future<Value>()>;
using Handler = std::function<Invocation(Decoder&, std::string_view)>;

template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {
  using Value = T;
};

// Runs `thunk`, which returns an R (a value, void or a Future), and gives
// its result as a Value.
template <typename R, typename F>
Future<Value> run_to_value(F&& thunk) {
  if constexpr (IsFuture<R>::value) {
    using T = typename IsFuture<R>::Value;
    R result = thunk();
    if constexpr (std::is_void_v<T>) {
      return result.then([] { return Value{nullptr, value_type<void>()}; });
    } else {
      return result.then([](const T& v) { return make_value<T>(v); });
    }
  } else if constexpr (std::is_void_v<R>) {
    thunk();
    return Future<Value>::make_ready(Value{nullptr, value_type<void>()});
  } else {
    return Future<Value>::make_ready(make_value<R>(thunk()));
  }
}

template <typename R, typename... A>
Handler make_handler(std::function<R(A...)> raw) {
  auto fn = std::make_shared<std::function<R(A...)>>(std::move(raw));
  return [fn](Decoder& d, std::string_view name) -> Invocation {
    auto args = std::make_shared<std::tuple<std::remove_cvref_t<A>...>>(
        decode_args<std::tuple<A...>>(d, name));
    return [fn, args]() {
      return run_to_value<R>([&] { return std::apply(*fn, std::move(*args)); });
    };
  };
}

template <typename F>
Handler make_handler(F fn) {
  return make_handler(std::function{std::move(fn)});
}

using GradsPtr = std::shared_ptr<GradRecorder>;

// The record of a call `agent` makes to `to` now; null outside a
// distributed autograd context (src/rpc/extensions.h).
GradsPtr autograd_call(RpcAgent& agent, int to);

// Starts a call's payload, encoded in `context` (which outlives e): inside
// a distributed autograd context, the context's ids come before the
// arguments.
inline void begin_call(Encoder& e, const MessageContext& context) {
  e.set_context(&context);
  if (GradRecorder* grads = context.grads; grads != nullptr) {
    e.write_tag(Tag::kAutograd);
    e.write_varint(grads->context_id());
    e.write_varint(grads->message_id());
  }
}

template <typename... A>
Payload encode_call(const MessageContext& context, const A&... args) {
  Payload p;
  std::string data;
  Encoder e(data, &p.buffers);
  begin_call(e, context);
  encode_args(e, args...);
  p.data = Buffer(std::move(data));
  return p;
}

// Where the continuations of the futures below run (RpcAgent's threading
// note).
const std::shared_ptr<Executor>& continuation_executor(RpcAgent& agent);

// The future a user gets for a call of `agent`: the reply decoded as an R
// in `context` (whose autograd record `grads` keeps alive), continuations
// off the loop.
template <typename R>
Future<R> decode_reply(
    RpcAgent& agent,
    Future<Payload> reply,
    std::string fn,
    MessageContext context,
    GradsPtr grads = nullptr) {
  context.grads = grads.get();
  return reply
      .then(
          [fn = std::move(fn), context, grads = std::move(grads)](
              const Payload& p) -> R {
            if constexpr (!std::is_void_v<R>) {
              Decoder d(p.data.view(), p.buffers);
              d.set_context(&context);
              return decode_result<R>(d, fn);
            }
          })
      .via(continuation_executor(agent));
}

// The process-wide registry TIDE_RPC_FUNCTION fills; every agent consults it
// after its own functions. Thread safe.
bool register_global_handler(const std::string& name, Handler handler);

template <typename F>
bool register_global_function(const std::string& name, F fn) {
  return register_global_handler(name, make_handler(std::move(fn)));
}

}  // namespace detail

}  // namespace tide::rpc
