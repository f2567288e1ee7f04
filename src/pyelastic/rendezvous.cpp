// tide._elastic's rendezvous: tide's backends (c10d, etcd, static) as Python
// objects, and a rendezvous handler written in Python as one the C++ agent
// drives.
#include <map>
#include <string>

#include <pybind11/stl.h>

#include "tide/common/error.h"
#include "tide/common/host.h"
#include "tide/rendezvous/registry.h"

#include "net/socket.h"
#include "pyelastic/py_common.h"

namespace tide::pyelastic {

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

namespace {

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

}  // namespace

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

}  // namespace tide::pyelastic
