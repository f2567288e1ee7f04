// tide._elastic's metric and event handlers: Python callables receiving
// what tide's agent, rendezvous and timers report (the GIL taken for each
// call; an exception is logged), and Python's metrics and events sent
// through tide's.
#include <string>
#include <type_traits>
#include <variant>

#include <pybind11/stl.h>

#include "tide/common/logging.h"
#include "tide/events/events.h"
#include "tide/metrics/metrics.h"

#include "pyelastic/py_common.h"

namespace tide::pyelastic {

namespace {

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

}  // namespace

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

}  // namespace tide::pyelastic
