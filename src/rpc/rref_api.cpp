#include <map>
#include <mutex>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "common/demangle.h"
#include "rpc/rrefs.h"

// RRef<T>'s non-template side, the control functions every agent
// registers (tide.rref.*), and the registry of methods proxies call. The
// books themselves are in rrefs.cpp.
namespace tide::rpc {

std::string RRefReport::str() const {
  // Appends rather than operator+ chains: GCC 12 at -O3 warns falsely
  // (-Wrestrict) on some of those.
  std::string out;
  for (const auto& o : owned) {
    out.append("owns ").append(o.id.str()).append(" (");
    out.append(o.type.empty() ? "?" : o.type);
    out.append(o.ready ? "), " : ", being made), ");
    out.append(std::to_string(o.users.size())).append(" user fork(s):");
    for (const auto& [fork, holder] : o.users) {
      out.append(" ").append(fork.str()).append("@").append(holder);
    }
    out.append("\n");
  }
  for (const auto& h : held) {
    out.append("holds ").append(h.id.str()).append(" fork ");
    out.append(h.fork.str()).append(" (").append(h.type).append(") of ");
    out.append(h.owner).append(h.confirmed ? "\n" : ", unconfirmed\n");
  }
  if (control_retries > 0) {
    out.append(std::to_string(control_retries)).append(" control retries\n");
  }
  for (const auto& [fork, to] : passing) {
    out.append("passing fork ").append(fork.str()).append(" to ");
    out.append(to).append("\n");
  }
  return out;
}
namespace detail {

namespace {

using std::chrono::milliseconds;

struct MethodRegistry {
  std::mutex mutex;
  std::map<std::string, Method, std::less<>> methods;  // "type.name"
};

MethodRegistry& methods() {
  static MethodRegistry r;
  return r;
}

std::string method_key(std::string_view type, std::string_view name) {
  return std::string(type) + "." + std::string(name);
}

std::pair<RRefId, RRefId> read_two(Decoder& d, std::string_view fn) {
  auto [w, l, fw, fl] =
      decode_args<std::tuple<int32_t, int64_t, int32_t, int64_t>>(d, fn);
  return {RRefId{w, l}, RRefId{fw, fl}};
}

Invocation done() {
  return [] {
    return Future<Value>::make_ready(Value{nullptr, value_type<void>()});
  };
}

}  // namespace

// --- the control functions ------------------------------------------------

std::vector<std::pair<std::string, Handler>> RRefBooks::handlers(
    FindHandler find) {
  std::weak_ptr<RRefBooks> weak = weak_from_this();
  auto books = [weak] {
    auto b = weak.lock();
    if (!b) {
      throw NetworkError("the rpc agent is shut down");
    }
    return b;
  };
  std::vector<std::pair<std::string, Handler>> out;
  out.emplace_back(
      std::string(kCreate),
      [books, find](Decoder& d, std::string_view) -> Invocation {
        auto [id, fork, name] = read_creation(d);
        auto b = books();
        // Registered on arrival (on_arrival); found again here.
        auto entry = b->add_fork(id, fork, d.caller());
        // The value stays here as the RRef's; an error is its value too, as
        // every user sees it: what the function raised, and where.
        auto fail = [entry, name, self = b->name_of(b->self())](
                        const std::exception_ptr& error) {
          std::string raised = "an unknown exception";
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            raised = tide::type_name(e) + ": " + e.what();
          } catch (...) {
          }
          entry->promise.set_exception(std::make_exception_ptr(RemoteError(
              name + "() on worker '" + self + "' raised " + raised)));
        };
        Invocation run;
        try {
          run = find(name)(d, name);
        } catch (...) {
          fail(std::current_exception());
          throw;
        }
        return [entry, run = std::move(run), fail]() {
          Future<Value> made = [&] {
            try {
              return run();
            } catch (...) {
              return Future<Value>::make_failed(std::current_exception());
            }
          }();
          Promise<Value> done;
          Future<Value> out = done.get_future();
          made.on_complete([entry, fail, done](const Future<Value>& f) mutable {
            if (auto error = f.error()) {
              fail(error);
              done.set_exception(error);
              return;
            }
            entry->promise.set_value(f.wait(milliseconds(0)));
            done.set_value(Value{nullptr, value_type<void>()});
          });
          return out;
        };
      });
  out.emplace_back(
      "tide.rref.fetch",
      [books](Decoder& d, std::string_view fn) -> Invocation {
        auto [w, l] = decode_args<std::tuple<int32_t, int64_t>>(d, fn);
        auto entry = books()->entry_for(RRefId{w, l}, true);
        return [entry] { return entry->value; };
      });
  out.emplace_back(
      "tide.rref.fork", [books](Decoder& d, std::string_view fn) -> Invocation {
        auto [id, fork] = read_two(d, fn);
        books()->add_fork(id, fork, d.caller());
        return done();
      });
  out.emplace_back(
      "tide.rref.accept",
      [books](Decoder& d, std::string_view fn) -> Invocation {
        auto [w, l] = decode_args<std::tuple<int32_t, int64_t>>(d, fn);
        books()->child_accepted(RRefId{w, l}, d.caller());
        return done();
      });
  out.emplace_back(
      "tide.rref.delete",
      [books](Decoder& d, std::string_view fn) -> Invocation {
        auto [id, fork] = read_two(d, fn);
        books()->del_fork(id, fork, d.caller());
        return done();
      });
  out.emplace_back(
      "tide.rref.invoke",
      [books](Decoder& d, std::string_view fn) -> Invocation {
        auto [w, l, type, method] =
            decode_args<std::tuple<int32_t, int64_t, std::string, std::string>>(
                d, fn);
        RRefId id{w, l};
        auto b = books();
        auto entry = b->entry_for(id, false);
        if (!entry) {
          throw InvalidArgument(
              "RRef " + id.str() + " is not on worker '" +
              b->name_of(b->self()) + "' (never made here, or deleted)");
        }
        Method m;
        {
          auto& r = methods();
          std::lock_guard lock(r.mutex);
          auto it = r.methods.find(method_key(type, method));
          if (it == r.methods.end()) {
            throw InvalidArgument(
                "no method '" + method + "' of " + type +
                " is registered (TIDE_RPC_METHOD) on worker '" +
                b->name_of(b->self()) + "'");
          }
          m = it->second;
        }
        MethodInvocation run = m(d, method);
        return [entry, run, type, id]() {
          Promise<Value> result;
          Future<Value> out = result.get_future();
          entry->value.on_complete(
              [entry, run, type, id, result](const Future<Value>& f) mutable {
                try {
                  Value v = f.wait(milliseconds(0));
                  if (v.type->name != type) {
                    throw InvalidArgument(
                        "RRef " + id.str() + " holds a " +
                        std::string(v.type->name) + ", not a " + type);
                  }
                  run(v.object.get())
                      .on_complete([result](const Future<Value>& r) mutable {
                        if (auto e = r.error()) {
                          result.set_exception(e);
                        } else {
                          result.set_value(r.wait(milliseconds(0)));
                        }
                      });
                } catch (...) {
                  result.set_exception(std::current_exception());
                }
              });
          return out;
        };
      });
  return out;
}

// --- RRef<T>'s non-template side
// ----------------------------------------------

RRefId rref_id(const RRefNode& n) {
  return n.id;
}

WorkerInfo rref_owner(const RRefNode& n) {
  return WorkerInfo{n.books->name_of(n.owner), n.owner};
}

bool rref_is_owner(const RRefNode& n) {
  return n.entry != nullptr;
}

bool rref_confirmed(const RRefNode& n) {
  return n.confirmed.ready() && !n.confirmed.error();
}

RpcAgent& rref_agent(const RRefNode& n) {
  return n.books->agent();
}

MessageContext rref_context(const RRefNode& n) {
  return n.books->context(n.owner);
}

std::shared_ptr<void> rref_local_value(
    const RRefNode& n, const ValueType* want, milliseconds timeout) {
  if (!n.entry) {
    throw InvalidArgument(
        "local_value() of RRef " + n.id.str() + ": it lives on '" +
        n.books->name_of(n.owner) + "', not on this worker ('" +
        n.books->name_of(n.books->self()) + "'); use to_here() or a proxy");
  }
  milliseconds t = timeout.count() > 0 ? timeout : n.books->rpc_timeout();
  Value v;
  try {
    v = n.entry->value.wait(t);
  } catch (const TimeoutError&) {
    throw TimeoutError(
        "RRef " + n.id.str() + ": its value was not made within " +
        std::to_string(t.count()) + " ms");
  }
  if (v.type->name != want->name) {
    throw InvalidArgument(
        "RRef " + n.id.str() + " holds a " + std::string(v.type->name) +
        ", not a " + std::string(want->name));
  }
  return v.object;
}

Future<Payload> rref_fetch(
    const RRefPtr& n, milliseconds timeout, GradRecorder* grads) {
  return n->books->call_owner(
      n,
      "tide.rref.fetch",
      timeout,
      encode_call(MessageContext{.grads = grads}, n->id.worker, n->id.local));
}

Future<Payload> rref_invoke(
    const RRefPtr& n, milliseconds timeout, Payload call) {
  return n->books->call_owner(n, "tide.rref.invoke", timeout, std::move(call));
}

RRefPtr rref_invoke_remote(
    const RRefPtr& n,
    milliseconds timeout,
    Payload call,
    const ValueType* result) {
  n->books->check_usable(*n);
  return n->books->start_remote(
      n->owner,
      "tide.rref.invoke",
      timeout.count() > 0 ? timeout : n->books->rpc_timeout(),
      std::move(call),
      result);
}

void rref_write(Encoder& e, const RRefPtr& n) {
  n->books->write(e, n);
}

RRefPtr rref_read(Decoder& d, const ValueType* want) {
  const MessageContext* context = d.context();
  if (context == nullptr || context->books == nullptr) {
    d.fail("an RRef can be decoded only by an rpc agent");
  }
  return context->books->read(d, want);
}

bool register_method(std::string_view type, const std::string& name, Method m) {
  auto& r = methods();
  std::lock_guard lock(r.mutex);
  r.methods[method_key(type, name)] = std::move(m);
  return true;
}

}  // namespace detail

}  // namespace tide::rpc
