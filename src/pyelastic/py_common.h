#pragma once

// What the parts of tide._elastic share (src/pyelastic/*.cpp, one part each:
// stores, rendezvous, the agent, metric and event handlers, timers): holding
// Python objects from C++, Python errors and values as tide's, and the
// functions that add each part to the module.
#include <memory>
#include <string>

#include <pybind11/pybind11.h>

#include "tide/rendezvous/rendezvous_handler.h"
#include "tide/store/store.h"

namespace tide::pyelastic {

namespace py = pybind11;

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
inline std::string describe(const py::error_already_set& e) {
  return py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
         py::str(e.value()).cast<std::string>();
}

inline std::string to_bytes(const py::handle& value) {
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

inline double seconds(const py::handle& timeout) {
  if (py::hasattr(timeout, "total_seconds")) {
    return timeout.attr("total_seconds")().cast<double>();
  }
  return timeout.cast<double>();
}

// A Python object as a tide store: one of ours, or any other with torch's
// store methods through an adapter that takes the GIL (stores.cpp).
std::shared_ptr<store::Store> to_store(const py::object& o);

// A rendezvous handler object as the agent's: one of tide's backends, or an
// adapter driving a handler written in Python (rendezvous.cpp).
std::shared_ptr<rendezvous::RendezvousHandler> to_handler(const py::object& o);

// Raises the Python twin (tide.elastic.rendezvous's classes, torch's names)
// of a C++ rendezvous error, a TimeoutError or an InvalidArgument.
void translate_errors(std::exception_ptr p);

void bind_stores(py::module_& m);
void bind_rendezvous(py::module_& m);
void bind_agent(py::module_& m);
void bind_metrics_and_events(py::module_& m);
void bind_timers(py::module_& m);
void bind_ft(py::module_& m);

}  // namespace tide::pyelastic
