// tide._elastic: the C++ pieces under tide.elastic (torch.distributed.
// elastic's Python API): the agent, rendezvous handlers, stores, metrics,
// events and timers. Python configures them and receives their results and
// callbacks (python/tide/elastic/). The GIL is released around everything
// that may block, and taken only around calls into Python; an exception a
// Python metric or event handler raises is logged and the caller goes on.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "tide/agent/local_elastic_agent.h"
#include "tide/common/error.h"
#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/events/events.h"
#include "tide/metrics/metrics.h"
#include "tide/rendezvous/registry.h"
#include "tide/store/hash_store.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"
#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"

#include "net/socket.h"

namespace py = pybind11;
using std::chrono::milliseconds;
using namespace tide;

namespace {

// ---- holding Python objects from C++ ----

// A Python object owned by C++ code that may drop it without the GIL, or
// after the interpreter is gone (a handler still configured at exit): then
// it is left alone.
class PyRef {
 public:
  explicit PyRef(py::object o) : o_(std::move(o)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (Py_IsInitialized() == 0) {
      o_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    o_ = py::object();
  }
  const py::object& get() const {
    return o_;
  }

 private:
  py::object o_;
};

// The Python error being handled, as "Type: message".
std::string describe(const py::error_already_set& e) {
  return py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
         py::str(e.value()).cast<std::string>();
}

std::string to_bytes(const py::handle& value) {
  if (py::isinstance<py::bytes>(value)) {
    return value.cast<std::string>();
  }
  if (py::isinstance<py::str>(value)) {
    return value.cast<std::string>();  // UTF-8, as torch's stores take it
  }
  throw py::type_error(
      "a store value is bytes or str, not " +
      py::str(value.get_type().attr("__name__")).cast<std::string>());
}

double seconds(const py::handle& timeout) {
  if (py::hasattr(timeout, "total_seconds")) {
    return timeout.attr("total_seconds")().cast<double>();
  }
  return timeout.cast<double>();
}

// ---- stores ----

// A Python store (torch.distributed's, or a user's with its methods) as a
// tide store, for a Python rendezvous handler's round. Calls take the GIL.
class PyStore final : public store::Store {
 public:
  explicit PyStore(py::object store) : store_(std::move(store)) {}

  void set(std::string_view key, std::string_view value) override {
    py::gil_scoped_acquire gil;
    call("set", key, py::bytes(value.data(), value.size()));
  }
  std::string get(std::string_view key) override {
    py::gil_scoped_acquire gil;
    return to_bytes(call("get", key));
  }
  int64_t add(std::string_view key, int64_t delta) override {
    py::gil_scoped_acquire gil;
    return call("add", key, delta).cast<int64_t>();
  }
  std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired) override {
    py::gil_scoped_acquire gil;
    return to_bytes(call(
        "compare_set",
        key,
        py::bytes(expected.data(), expected.size()),
        py::bytes(desired.data(), desired.size())));
  }
  bool check(const std::vector<std::string>& keys) override {
    py::gil_scoped_acquire gil;
    return call("check", keys).cast<bool>();
  }
  using Store::wait;
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    call("wait", keys, timeout);
  }
  bool delete_key(std::string_view key) override {
    py::gil_scoped_acquire gil;
    return call("delete_key", key).cast<bool>();
  }
  int64_t num_keys() override {
    py::gil_scoped_acquire gil;
    return call("num_keys").cast<int64_t>();
  }
  void append(std::string_view key, std::string_view value) override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(store_.get(), "append")) {
      call("append", key, py::bytes(value.data(), value.size()));
      return;
    }
    // torch 1.13's stores have no append: compare_set until it holds.
    std::string expected;
    for (;;) {
      std::string desired = expected + std::string(value);
      std::string now = to_bytes(call(
          "compare_set",
          key,
          py::bytes(expected.data(), expected.size()),
          py::bytes(desired.data(), desired.size())));
      if (now == desired) {
        return;
      }
      expected = now;
    }
  }
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override {
    py::gil_scoped_acquire gil;
    std::vector<std::string> out;
    for (const auto& k : keys) {
      out.push_back(to_bytes(call("get", k)));
    }
    return out;
  }
  void set_timeout(milliseconds timeout) override {
    Store::set_timeout(timeout);
    py::gil_scoped_acquire gil;
    if (py::hasattr(store_.get(), "set_timeout")) {
      call("set_timeout", timeout);
    }
  }

 protected:
  void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) override {
    py::gil_scoped_acquire gil;
    for (size_t i = 0; i < keys.size(); ++i) {
      call("set", keys[i], py::bytes(values[i]));
    }
  }

 private:
  // Calls store.name(args...) under the GIL; a Python error becomes tide's
  // (a timeout stays a timeout).
  template <typename... Args>
  py::object call(const char* name, Args&&... args) {
    try {
      return store_.get().attr(name)(std::forward<Args>(args)...);
    } catch (py::error_already_set& e) {
      std::string what = std::string("store.") + name + ": " + describe(e);
      if (what.find("imeout") != std::string::npos) {
        throw TimeoutError(what);
      }
      throw Error(what);
    }
  }

  PyRef store_;
};

// A Python object as a tide store: one of ours, or any other through
// PyStore.
std::shared_ptr<store::Store> to_store(const py::object& o) {
  if (py::isinstance<store::Store>(o)) {
    return o.cast<std::shared_ptr<store::Store>>();
  }
  return std::make_shared<PyStore>(o);
}

void bind_stores(py::module_& m) {
  using store::Store;
  py::class_<Store, std::shared_ptr<Store>>(
      m, "Store", "A key-value store (torch.distributed.Store's methods).")
      .def(
          "set",
          [](Store& s, const std::string& key, const py::object& value) {
            std::string v = to_bytes(value);
            py::gil_scoped_release release;
            s.set(key, v);
          },
          py::arg("key"),
          py::arg("value"))
      .def(
          "get",
          [](Store& s, const std::string& key) {
            std::string v;
            {
              py::gil_scoped_release release;
              v = s.get(key);
            }
            return py::bytes(v);
          },
          py::arg("key"))
      .def(
          "add",
          &Store::add,
          py::arg("key"),
          py::arg("value"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "compare_set",
          [](Store& s,
             const std::string& key,
             const py::object& expected,
             const py::object& desired) {
            std::string e = to_bytes(expected);
            std::string d = to_bytes(desired);
            std::string v;
            {
              py::gil_scoped_release release;
              v = s.compare_set(key, e, d);
            }
            return py::bytes(v);
          },
          py::arg("key"),
          py::arg("expected_value"),
          py::arg("desired_value"))
      .def(
          "check",
          &Store::check,
          py::arg("keys"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait",
          [](Store& s,
             const std::vector<std::string>& keys,
             const py::object& timeout) {
            milliseconds t = timeout.is_none()
                                 ? s.timeout()
                                 : milliseconds(static_cast<int64_t>(
                                       seconds(timeout) * 1e3));
            py::gil_scoped_release release;
            s.wait(keys, t);
          },
          py::arg("keys"),
          py::arg("timeout") = py::none())
      .def(
          "delete_key",
          &Store::delete_key,
          py::arg("key"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "num_keys",
          &Store::num_keys,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "append",
          [](Store& s, const std::string& key, const py::object& value) {
            std::string v = to_bytes(value);
            py::gil_scoped_release release;
            s.append(key, v);
          },
          py::arg("key"),
          py::arg("value"))
      .def(
          "multi_get",
          [](Store& s, const std::vector<std::string>& keys) {
            std::vector<std::string> values;
            {
              py::gil_scoped_release release;
              values = s.multi_get(keys);
            }
            py::list out;
            for (const auto& v : values) {
              out.append(py::bytes(v));
            }
            return out;
          },
          py::arg("keys"))
      .def(
          "multi_set",
          [](Store& s,
             const std::vector<std::string>& keys,
             const std::vector<py::object>& values) {
            std::vector<std::string> v;
            for (const auto& x : values) {
              v.push_back(to_bytes(x));
            }
            py::gil_scoped_release release;
            s.multi_set(keys, v);
          },
          py::arg("keys"),
          py::arg("values"))
      .def(
          "set_timeout",
          [](Store& s, const py::object& timeout) {
            s.set_timeout(
                milliseconds(static_cast<int64_t>(seconds(timeout) * 1e3)));
          },
          py::arg("timeout"))
      .def_property_readonly(
          "timeout", [](const Store& s) { return s.timeout(); });

  // torch.distributed's TCPStore, HashStore and PrefixStore, by name.
  py::class_<store::TcpStore, Store, std::shared_ptr<store::TcpStore>>(
      m, "TCPStore")
      .def(
          py::init([](const std::string& host,
                      uint16_t port,
                      const py::object& /*world_size*/,
                      bool is_master,
                      const py::object& timeout,
                      bool /*wait_for_workers*/,
                      const std::string& token) {
            store::TcpStoreOptions o;
            o.host = host;
            o.port = port;
            o.is_server = is_master;
            o.token = token;
            if (!timeout.is_none()) {
              o.timeout =
                  milliseconds(static_cast<int64_t>(seconds(timeout) * 1e3));
            }
            py::gil_scoped_release release;
            return std::make_shared<store::TcpStore>(std::move(o));
          }),
          py::arg("host_name"),
          py::arg("port"),
          py::arg("world_size") = py::none(),
          py::arg("is_master") = false,
          py::arg("timeout") = py::none(),
          py::arg("wait_for_workers") = true,
          py::arg("token") = "")
      .def_property_readonly("port", &store::TcpStore::port);
  m.def("HashStore", &store::make_hash_store);
  py::class_<store::PrefixStore, Store, std::shared_ptr<store::PrefixStore>>(
      m, "PrefixStore")
      .def(
          py::init([](const std::string& prefix, const py::object& inner) {
            return std::make_shared<store::PrefixStore>(
                prefix, to_store(inner));
          }),
          py::arg("prefix"),
          py::arg("store"));
}

// ---- rendezvous ----

// Raises the Python twin (tide.elastic.rendezvous's classes, torch's names)
// of a C++ rendezvous error.
void translate_errors(std::exception_ptr p) {
  auto raise = [](const char* cls, const std::exception& e) {
    py::object type =
        py::module_::import("tide.elastic.rendezvous.api").attr(cls);
    PyErr_SetString(type.ptr(), e.what());
  };
  try {
    std::rethrow_exception(p);
  } catch (const RendezvousClosedError& e) {
    raise("RendezvousClosedError", e);
  } catch (const RendezvousTimeoutError& e) {
    raise("RendezvousTimeoutError", e);
  } catch (const RendezvousConnectionError& e) {
    raise("RendezvousConnectionError", e);
  } catch (const RendezvousStateError& e) {
    raise("RendezvousStateError", e);
  } catch (const RendezvousError& e) {
    raise("RendezvousError", e);
  } catch (const TimeoutError& e) {
    PyErr_SetString(PyExc_TimeoutError, e.what());
  } catch (const InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  }
}

// A rendezvous handler written in Python (a subclass of tide.elastic's
// RendezvousHandler) driving the C++ agent. Its round's store may be any
// store with torch's methods. As torch's agent did before handlers gave
// out the workers' store address, node 0 picks the workers' MASTER_ADDR
// (this host's name) and a free MASTER_PORT and shares them in that store.
class PyRendezvousHandler final : public rendezvous::RendezvousHandler {
 public:
  explicit PyRendezvousHandler(py::object handler)
      : handler_(std::move(handler)) {}

  std::string get_backend() const override {
    return call<std::string>("get_backend");
  }
  rendezvous::RendezvousInfo next_rendezvous() override {
    rendezvous::RendezvousInfo info;
    {
      py::gil_scoped_acquire gil;
      py::object r = invoke("next_rendezvous");
      py::object store;
      if (py::hasattr(r, "store")) {  // torch 2.x's RendezvousInfo
        store = r.attr("store");
        info.rank = r.attr("rank").cast<int>();
        info.world_size = r.attr("world_size").cast<int>();
      } else {
        auto t = r.cast<py::tuple>();
        if (t.size() != 3) {
          throw RendezvousError(
              "next_rendezvous() must return (store, rank, world_size)");
        }
        store = t[0];
        info.rank = t[1].cast<int>();
        info.world_size = t[2].cast<int>();
      }
      info.store = to_store(store);
    }
    if (info.rank < 0 || info.rank >= info.world_size) {
      throw RendezvousError(
          "next_rendezvous() returned rank " + std::to_string(info.rank) +
          " of a world of " + std::to_string(info.world_size));
    }
    info.round = rounds_++;
    std::string base = "torchelastic/round" + std::to_string(info.round) + "/";
    if (info.rank == 0) {
      info.store->set(base + "MASTER_ADDR", fqdn());
      info.store->set(base + "MASTER_PORT", std::to_string(net::free_port()));
    }
    info.bootstrap.master_addr = info.store->get(base + "MASTER_ADDR");
    info.bootstrap.master_port =
        static_cast<uint16_t>(std::stoi(info.store->get(base + "MASTER_PORT")));
    return info;
  }
  bool is_closed() override {
    return call<bool>("is_closed");
  }
  void set_closed() override {
    call<void>("set_closed");
  }
  int num_nodes_waiting() override {
    return call<int>("num_nodes_waiting");
  }
  std::string get_run_id() const override {
    return call<std::string>("get_run_id");
  }
  bool shutdown() override {
    py::gil_scoped_acquire gil;
    py::object r = invoke("shutdown");
    return r.is_none() || r.cast<bool>();
  }
  bool use_agent_store() const override {
    return false;
  }

 private:
  // handler.name() (the GIL held). A Python error becomes the rendezvous
  // error of the same name (torch's), or a RendezvousError: it fails the
  // round, as in torch.
  py::object invoke(const char* name) const {
    try {
      return handler_.get().attr(name)();
    } catch (py::error_already_set& e) {
      std::string type = py::str(e.type().attr("__name__")).cast<std::string>();
      std::string what =
          "rendezvous handler's " + std::string(name) + "(): " + describe(e);
      if (type == "RendezvousClosedError") {
        throw RendezvousClosedError(what);
      }
      if (type == "RendezvousTimeoutError") {
        throw RendezvousTimeoutError(what);
      }
      throw RendezvousError(what);
    }
  }
  // invoke(name) under the GIL, its result as a T.
  template <typename T>
  T call(const char* name) const {
    py::gil_scoped_acquire gil;
    py::object r = invoke(name);
    if constexpr (!std::is_void_v<T>) {
      return r.cast<T>();
    }
  }

  PyRef handler_;
  int64_t rounds_ = 0;
};

std::shared_ptr<rendezvous::RendezvousHandler> to_handler(const py::object& o) {
  if (py::isinstance<rendezvous::RendezvousHandler>(o)) {
    return o.cast<std::shared_ptr<rendezvous::RendezvousHandler>>();
  }
  py::object native = py::getattr(o, "_native", py::none());
  if (py::isinstance<rendezvous::RendezvousHandler>(native)) {
    return native.cast<std::shared_ptr<rendezvous::RendezvousHandler>>();
  }
  return std::make_shared<PyRendezvousHandler>(o);
}

void bind_rendezvous(py::module_& m) {
  using rendezvous::RendezvousHandler;
  py::class_<RendezvousHandler, std::shared_ptr<RendezvousHandler>>(
      m,
      "NativeHandler",
      "One of tide's rendezvous backends (c10d, etcd, static).")
      .def(
          "get_backend",
          &RendezvousHandler::get_backend,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "next_rendezvous",
          [](RendezvousHandler& h) {
            rendezvous::RendezvousInfo info;
            {
              py::gil_scoped_release release;
              info = h.next_rendezvous();
            }
            return py::make_tuple(info.store, info.rank, info.world_size);
          })
      .def(
          "is_closed",
          &RendezvousHandler::is_closed,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "set_closed",
          &RendezvousHandler::set_closed,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "num_nodes_waiting",
          &RendezvousHandler::num_nodes_waiting,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "get_run_id",
          &RendezvousHandler::get_run_id,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "shutdown",
          &RendezvousHandler::shutdown,
          py::call_guard<py::gil_scoped_release>())
      .def("use_agent_store", &RendezvousHandler::use_agent_store);

  m.def(
      "create_handler",
      [](const std::string& backend,
         const std::string& endpoint,
         const std::string& run_id,
         int min_nodes,
         int max_nodes,
         const std::string& local_addr,
         const std::map<std::string, std::string>& config) {
        rendezvous::RendezvousParameters p{
            .backend = backend,
            .endpoint = endpoint,
            .run_id = run_id,
            .min_nodes = min_nodes,
            .max_nodes = max_nodes,
            .local_addr = local_addr,
            .config = config,
        };
        py::gil_scoped_release release;
        // Destroyed without the GIL: its threads, which it joins, may be
        // waiting to record an event with a Python handler.
        return std::shared_ptr<RendezvousHandler>(
            rendezvous::handler_registry().create(p).release(),
            [](RendezvousHandler* h) {
              if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
                py::gil_scoped_release unlocked;
                delete h;
              } else {
                delete h;
              }
            });
      },
      py::arg("backend"),
      py::arg("endpoint"),
      py::arg("run_id"),
      py::arg("min_nodes"),
      py::arg("max_nodes"),
      py::arg("local_addr"),
      py::arg("config"));
  m.def("native_backends", [] {
    return rendezvous::handler_registry().backends();
  });
}

// ---- the agent ----

// The agent run() is running, for the signal handler.
std::atomic<agent::LocalElasticAgent*> g_running{nullptr};

// As tiderun: the first signal stops the workers and run() reports it; a
// second ends the process with the signal's default action (the workers die
// with it).
extern "C" void on_signal(int sig) {
  if (auto* a = g_running.exchange(nullptr)) {
    a->request_stop(sig);
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

agent::StdSpec to_std_spec(const py::object& o) {
  agent::StdSpec spec;
  if (py::isinstance<py::dict>(o)) {
    for (auto [k, v] : o.cast<py::dict>()) {
      spec.by_rank[k.cast<int>()] = static_cast<agent::Std>(v.cast<int>());
    }
  } else {
    spec.all = static_cast<agent::Std>(o.cast<int>());
  }
  return spec;
}

py::dict to_dict(const agent::Worker& w) {
  py::dict d;
  d["local_rank"] = w.local_rank;
  d["global_rank"] = w.global_rank;
  d["role_rank"] = w.role_rank;
  d["world_size"] = w.world_size;
  d["role_world_size"] = w.role_world_size;
  d["pid"] = w.pid;
  return d;
}

py::dict to_dict(const agent::ProcessFailure& f) {
  py::dict d;
  d["local_rank"] = f.local_rank;
  d["global_rank"] = f.global_rank;
  d["pid"] = f.pid;
  d["exitcode"] = f.exitcode;
  d["host"] = f.host;
  d["timestamp"] = f.timestamp;
  d["error_file"] = f.error_file;
  d["error_file_data"] = f.error_file_data;
  d["message"] = f.message;
  d["traceback"] = f.traceback;
  d["signal_name"] = f.signal_name();
  return d;
}

// The C++ agent, configured from Python (tide.elastic's LocalElasticAgent
// builds the spec from torch's WorkerSpec).
class Agent {
 public:
  explicit Agent(const py::dict& s) {
    agent::WorkerSpec spec;
    spec.role = s["role"].cast<std::string>();
    spec.local_world_size = s["local_world_size"].cast<int>();
    spec.entrypoint =
        agent::Command{s["argv"].cast<std::vector<std::string>>()};
    spec.rdzv_handler = to_handler(s["rdzv_handler"]);
    spec.max_restarts = s["max_restarts"].cast<int>();
    spec.monitor_interval = milliseconds(
        static_cast<int64_t>(s["monitor_interval"].cast<double>() * 1e3));
    spec.redirects = to_std_spec(s["redirects"]);
    spec.tee = to_std_spec(s["tee"]);
    spec.log_dir = s["log_dir"].cast<std::string>();
    if (!s["master_addr"].is_none()) {
      spec.master_addr = s["master_addr"].cast<std::string>();
    }
    if (!s["master_port"].is_none()) {
      spec.master_port = s["master_port"].cast<uint16_t>();
    }
    spec.env = s["env"].cast<std::map<std::string, std::string>>();
    spec.exit_barrier_timeout = milliseconds(
        static_cast<int64_t>(s["exit_barrier_timeout"].cast<double>() * 1e3));
    if (!s["timer_file"].is_none()) {  // TORCHELASTIC_ENABLE_FILE_TIMER=1
      spec.timer = agent::WorkerSpec::Timer::kFile;
      spec.timer_file = s["timer_file"].cast<std::string>();
    }
    agent::validate(spec);
    agent_ = std::make_unique<agent::LocalElasticAgent>(std::move(spec));
  }

  // Runs the agent without the GIL. With handle_signals (the main thread),
  // SIGINT, SIGTERM, SIGHUP and SIGQUIT stop the workers meanwhile, as in
  // torch; the result then says which signal.
  py::dict run(bool handle_signals) {
    agent::RunResult result;
    int stopped_by = 0;
    {
      py::gil_scoped_release release;
      struct sigaction before[std::size(kStopSignals)];
      if (handle_signals) {
        g_running.store(agent_.get());
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t i = 0; i < std::size(kStopSignals); ++i) {
          ::sigaction(kStopSignals[i], &sa, &before[i]);
        }
      }
      try {
        result = agent_->run();
      } catch (const agent::SignalException& e) {
        stopped_by = e.signal();
      } catch (...) {
        restore(handle_signals, before);
        throw;
      }
      restore(handle_signals, before);
    }
    py::dict out;
    out["state"] = agent::to_string(result.state);
    out["stopped_by_signal"] = stopped_by;
    py::dict failures;
    for (const auto& [rank, f] : result.failures) {
      failures[py::int_(rank)] = to_dict(f);
    }
    out["failures"] = failures;
    out["group"] = group();
    return out;
  }

  // Without the GIL: the agent's threads, which it joins, may be waiting
  // for it to call a Python handler.
  ~Agent() {
    py::gil_scoped_release release;
    agent_.reset();
  }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  void request_stop(int sig) {
    agent_->request_stop(sig);
  }

  // The group of the current or last attempt.
  py::dict group() const {
    const agent::WorkerGroup& g = agent_->worker_group();
    py::dict d;
    py::list workers;
    for (const auto& w : g.workers) {
      workers.append(to_dict(w));
    }
    d["workers"] = workers;
    d["group_rank"] = g.group_rank;
    d["group_world_size"] = g.group_world_size;
    d["state"] = agent::to_string(g.state);
    d["store"] = g.store ? py::cast(g.store) : py::none();
    return d;
  }

  std::string run_log_dir() const {
    return agent_->run_log_dir();
  }
  int remaining_restarts() const {
    return agent_->remaining_restarts();
  }

 private:
  static void restore(bool handle_signals, const struct sigaction* before) {
    if (!handle_signals) {
      return;
    }
    g_running.store(nullptr);
    for (size_t i = 0; i < std::size(kStopSignals); ++i) {
      ::sigaction(kStopSignals[i], &before[i], nullptr);
    }
  }

  std::unique_ptr<agent::LocalElasticAgent> agent_;
};

void bind_agent(py::module_& m) {
  py::class_<Agent>(m, "Agent")
      .def(py::init<const py::dict&>(), py::arg("spec"))
      .def("run", &Agent::run, py::arg("handle_signals"))
      .def("request_stop", &Agent::request_stop, py::arg("signal"))
      .def("group", &Agent::group)
      .def("run_log_dir", &Agent::run_log_dir)
      .def("remaining_restarts", &Agent::remaining_restarts);
}

// ---- metrics and events ----

// Hands each metric to a Python callable (timestamp, group, name, value).
class PyMetricHandler final : public metrics::MetricHandler {
 public:
  explicit PyMetricHandler(py::object emit) : emit_(std::move(emit)) {}
  void emit(const metrics::MetricData& d) override {
    if (Py_IsInitialized() == 0) {
      return;
    }
    py::gil_scoped_acquire gil;
    try {
      emit_.get()(d.timestamp, d.group_name, d.name, d.value);
    } catch (py::error_already_set& e) {
      TIDE_LOG_ERROR(
          "metric handler raised on {}.{}: {}",
          d.group_name,
          d.name,
          describe(e));
    }
  }

 private:
  PyRef emit_;
};

py::object to_py(const events::MetadataValue& v) {
  return std::visit(
      [](const auto& x) -> py::object {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return py::none();
        } else {
          return py::cast(x);
        }
      },
      v);
}

events::MetadataValue to_metadata(const py::handle& v) {
  if (v.is_none()) {
    return std::monostate{};
  }
  if (py::isinstance<py::bool_>(v)) {
    return v.cast<bool>();
  }
  if (py::isinstance<py::int_>(v)) {
    return v.cast<int64_t>();
  }
  if (py::isinstance<py::float_>(v)) {
    return v.cast<double>();
  }
  return py::str(v).cast<std::string>();
}

// Hands each event to Python callables: (name, source, timestamp, metadata)
// for the agent's events, a dict of fields for the rendezvous'.
class PyEventHandler final : public events::EventHandler {
 public:
  PyEventHandler(py::object record, py::object record_rdzv)
      : record_(std::move(record)), record_rdzv_(std::move(record_rdzv)) {}
  void handle(const events::Event& e) override {
    if (Py_IsInitialized() == 0) {
      return;
    }
    py::gil_scoped_acquire gil;
    try {
      py::dict metadata;
      for (const auto& [k, v] : e.metadata) {
        metadata[py::str(k)] = to_py(v);
      }
      record_.get()(e.name, events::to_string(e.source), e.timestamp, metadata);
    } catch (py::error_already_set& err) {
      TIDE_LOG_ERROR("event handler raised on {}: {}", e.name, describe(err));
    }
  }
  void handle(const events::RdzvEvent& e) override {
    if (Py_IsInitialized() == 0) {
      return;
    }
    py::gil_scoped_acquire gil;
    if (record_rdzv_.get().is_none()) {
      return;
    }
    try {
      py::dict d;
      d["name"] = e.name;
      d["run_id"] = e.run_id;
      d["message"] = e.message;
      d["hostname"] = e.hostname;
      d["pid"] = e.pid;
      d["node_state"] = events::to_string(e.node_state);
      d["master_endpoint"] = e.master_endpoint;
      d["rank"] = e.rank ? py::cast(*e.rank) : py::none();
      d["local_id"] = e.local_id ? py::cast(*e.local_id) : py::none();
      d["error_trace"] = e.error_trace;
      record_rdzv_.get()(d);
    } catch (py::error_already_set& err) {
      TIDE_LOG_ERROR("event handler raised on {}: {}", e.name, describe(err));
    }
  }

 private:
  PyRef record_;
  PyRef record_rdzv_;
};

void bind_metrics_and_events(py::module_& m) {
  m.def(
      "configure_metrics",
      [](const py::object& handler, const std::string& group) {
        std::shared_ptr<metrics::MetricHandler> h;
        if (py::isinstance<py::str>(handler)) {
          auto kind = handler.cast<std::string>();
          if (kind == "console") {
            h = std::make_shared<metrics::ConsoleMetricHandler>();
          } else {
            h = std::make_shared<metrics::NullMetricHandler>();
          }
        } else {
          h = std::make_shared<PyMetricHandler>(handler);
        }
        metrics::configure(std::move(h), group);
      },
      py::arg("handler"),
      py::arg("group"));
  m.def(
      "put_metric",
      &metrics::put_metric,
      py::arg("name"),
      py::arg("value"),
      py::arg("group"));
  m.def(
      "configure_events",
      [](const py::object& record, const py::object& record_rdzv) {
        if (record.is_none()) {
          events::configure(std::make_shared<events::NullEventHandler>());
          return;
        }
        events::configure(
            std::make_shared<PyEventHandler>(record, record_rdzv));
      },
      py::arg("record"),
      py::arg("record_rdzv"));
  m.def(
      "record_event",
      [](const std::string& name,
         const std::string& source,
         int64_t timestamp,
         const py::dict& metadata) {
        events::Event e{
            .name = name,
            .source = source == "WORKER" ? events::EventSource::kWorker
                                         : events::EventSource::kAgent,
            .timestamp = timestamp,
        };
        for (auto [k, v] : metadata) {
          e.metadata[py::str(k).cast<std::string>()] = to_metadata(v);
        }
        py::gil_scoped_release release;
        events::record(std::move(e));
      },
      py::arg("name"),
      py::arg("source"),
      py::arg("timestamp"),
      py::arg("metadata"));
}

// ---- timers ----

// pid's parent, from /proc; -1 when it is gone.
pid_t parent_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  auto close = text.rfind(')');  // the command may hold spaces and ')'
  if (close == std::string::npos) {
    return -1;
  }
  char state = 0;
  int ppid = -1;
  if (std::sscanf(text.c_str() + close + 1, " %c %d", &state, &ppid) != 2) {
    return -1;
  }
  return ppid;
}

// A timer server started by a Python launcher signals only the launcher's
// own workers, and their children: processes whose parent, or whose
// session leader's parent, is this process (the agent starts each worker in
// a session of its own).
bool is_own_worker(pid_t pid) {
  pid_t self = ::getpid();
  if (parent_of(pid) == self) {
    return true;
  }
  pid_t session = ::getsid(pid);
  return session > 0 && parent_of(session) == self;
}

// A timer server on `path` (a socket, or a FIFO) that signals only this
// process's own workers.
template <typename Server>
void bind_timer_server(py::module_& m, const char* name) {
  py::class_<Server, timer::TimerServer>(m, name)
      .def(
          py::init([](const std::string& path,
                      double max_interval,
                      const std::string& run_id) {
            return std::make_unique<Server>(
                path,
                timer::TimerServerOptions{
                    .max_interval =
                        milliseconds(static_cast<int64_t>(max_interval * 1e3)),
                    .run_id = run_id,
                    .allow_pid = is_own_worker,
                });
          }),
          py::arg("path"),
          py::arg("max_interval"),
          py::arg("run_id") = "")
      .def_property_readonly("path", &Server::path);
}

void bind_timers(py::module_& m) {
  using timer::TimerClient;
  using timer::TimerServer;
  py::class_<TimerServer>(m, "TimerServer")
      .def(
          "start",
          &TimerServer::start,
          py::call_guard<py::gil_scoped_release>())
      .def("stop", &TimerServer::stop, py::call_guard<py::gil_scoped_release>())
      .def("size", &TimerServer::size);
  bind_timer_server<timer::LocalTimerServer>(m, "LocalTimerServer");
  bind_timer_server<timer::FileTimerServer>(m, "FileTimerServer");

  py::class_<TimerClient, std::shared_ptr<TimerClient>>(m, "TimerClient")
      .def(
          "acquire",
          &TimerClient::acquire,
          py::arg("scope_id"),
          py::arg("expiration_time"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "release",
          &TimerClient::release,
          py::arg("scope_id"),
          py::call_guard<py::gil_scoped_release>());
  m.def(
      "local_timer_client",
      [](const std::string& path, int sig) -> std::shared_ptr<TimerClient> {
        return std::make_shared<timer::LocalTimerClient>(path, sig);
      },
      py::arg("path"),
      py::arg("signal"));
  m.def(
      "file_timer_client",
      [](const std::string& path, int sig) -> std::shared_ptr<TimerClient> {
        return std::make_shared<timer::FileTimerClient>(path, sig);
      },
      py::arg("path"),
      py::arg("signal"));
}

}  // namespace

PYBIND11_MODULE(_elastic, m) {
  m.doc() =
      "tide's agent, rendezvous, stores, metrics, events and timers "
      "under tide.elastic";
  py::register_exception_translator(translate_errors);
  bind_stores(m);
  bind_rendezvous(m);
  bind_agent(m);
  bind_metrics_and_events(m);
  bind_timers(m);
  m.def("fqdn", [] { return fqdn(); });
}
