// tide._torch_rpc: the TIDE backend's agent and options as Python types,
// subclasses of torch's RpcAgent and RpcBackendOptions (so torch's frontend
// takes them). tide/torch_rpc.py registers the backend with them.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/rpc/request_callback_impl.h>
#include <torch/csrc/utils/pybind.h>

#include "torch_rpc/agent.h"

namespace py = pybind11;
namespace tr = torch::distributed::rpc;
using tide::torch_rpc::Agent;
using tide::torch_rpc::AgentOptions;

namespace {

// Gives a worker thread a Python thread state it keeps. Without one, every
// GIL acquisition on it (torch's callback takes the GIL up to three times a
// request) makes a new thread state and frees it on release: Python 3.11
// maps and unmaps a 16 KiB frame stack each time, and the unmap's TLB
// shootdown stalls the other cores, which on this VM made a Python call's
// round trip several times slower.
void keep_thread_state() {
  py::gil_scoped_acquire gil;
  gil.inc_ref();  // never dropped to zero: the state stays with the thread
}

}  // namespace

PYBIND11_MODULE(_torch_rpc, m) {
  m.doc() = "tide's transport under torch.distributed.rpc (the TIDE backend)";
  py::module_::import("torch.distributed.rpc");

  py::class_<
      AgentOptions,
      tr::RpcBackendOptions,
      std::shared_ptr<AgentOptions>>(m, "TideRpcBackendOptions")
      .def(py::init<>())
      .def_readwrite("num_worker_threads", &AgentOptions::num_worker_threads)
      .def_readwrite("transports", &AgentOptions::transports)
      .def_readwrite("lanes", &AgentOptions::lanes)
      .def_readwrite("token", &AgentOptions::token)
      .def_readwrite("poll_us", &AgentOptions::poll_us)
      .def_readwrite("listen_host", &AgentOptions::listen_host);

  py::class_<Agent, tr::RpcAgent, std::shared_ptr<Agent>>(m, "TideAgent")
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store,
                      std::string name,
                      int rank,
                      int world_size,
                      const AgentOptions& options) {
            // The rendezvous waits for the other workers: without the GIL
            // (but pybind11 registers the instance with it).
            py::gil_scoped_release release;
            return std::make_shared<Agent>(
                store,
                std::move(name),
                rank,
                world_size,
                options,
                std::make_unique<tr::RequestCallbackImpl>(),
                &keep_thread_state);
          }),
          py::arg("store"),
          py::arg("name"),
          py::arg("rank"),
          py::arg("world_size"),
          py::arg("rpc_backend_options"))
      .def(
          "get_worker_info",
          [](const Agent& a) { return a.getWorkerInfo(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "get_worker_info",
          [](const Agent& a, const std::string& name) {
            return a.getWorkerInfo(name);
          },
          py::arg("worker_name"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "get_worker_info",
          [](const Agent& a, tr::worker_id_t id) {
            return a.getWorkerInfo(id);
          },
          py::arg("id"),
          py::call_guard<py::gil_scoped_release>())
      // Both wait for the worker threads, which may need the GIL.
      .def(
          "join",
          &Agent::join,
          py::arg("shutdown") = false,
          py::arg("timeout") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "shutdown",
          &Agent::shutdown,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "connection_kind",
          &Agent::connection_kind,
          py::arg("worker"),
          py::call_guard<py::gil_scoped_release>())
      .def("_get_backend_options", [](const Agent& a) { return a.options(); });
}
