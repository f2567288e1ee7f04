// tide._elastic's stores: tide's TCPStore, HashStore and PrefixStore as
// Python objects with torch.distributed.Store's methods, and any Python store
// (torch's, or a user's) as a tide store.
#include <cstdio>
#include <string>
#include <vector>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "tide/common/error.h"
#include "tide/store/hash_store.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "pyelastic/py_common.h"

namespace tide::pyelastic {

using std::chrono::milliseconds;

namespace {

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

// TCPStore's dialect: "legacy" (torch < 2.2), "modern" (torch >= 2.2), or
// None: the dialect of the torch this interpreter has, whose server is the
// one its TCPStore most likely meets (tide's serves both); legacy without
// torch, which every torch 1.x server speaks.
store::Dialect to_dialect(const py::object& chosen) {
  if (chosen.is_none()) {
    std::string version;
    try {
      version = py::module_::import("importlib.metadata")
                    .attr("version")("torch")
                    .cast<std::string>();
    } catch (const py::error_already_set&) {
      return store::Dialect::kLegacy;  // No torch here.
    }
    int major = 0;
    int minor = 0;
    std::sscanf(version.c_str(), "%d.%d", &major, &minor);
    bool modern = major > 2 || (major == 2 && minor >= 2);
    return modern ? store::Dialect::kModern : store::Dialect::kLegacy;
  }
  auto name = chosen.cast<std::string>();
  if (name == "legacy") {
    return store::Dialect::kLegacy;
  }
  if (name == "modern") {
    return store::Dialect::kModern;
  }
  throw py::value_error(
      "dialect must be 'legacy' (torch < 2.2's servers), 'modern' (torch >= "
      "2.2's) or None (this interpreter's torch), not '" +
      name + "'");
}

}  // namespace

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
                      const std::string& token,
                      const py::object& dialect) {
            store::TcpStoreOptions o;
            o.host = host;
            o.port = port;
            o.is_server = is_master;
            o.token = token;
            o.dialect = to_dialect(dialect);
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
          py::arg("token") = "",
          py::arg("dialect") = py::none())
      .def_property_readonly("port", &store::TcpStore::port)
      .def_property_readonly("dialect", [](const store::TcpStore& s) {
        return s.dialect() == store::Dialect::kModern ? "modern" : "legacy";
      });
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

}  // namespace tide::pyelastic
