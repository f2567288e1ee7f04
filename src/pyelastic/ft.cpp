// tide._elastic's fault tolerance: the quorum client of a replica group
// (tide::ft::QuorumClient) under tide.ft's Manager (python/tide/ft.py).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "tide/ft/quorum.h"

#include "ft/state_transfer.h"
#include "pyelastic/py_common.h"

namespace tide::pyelastic {

namespace {
std::chrono::milliseconds ms(const py::handle& t) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds(t) * 1e3));
}
}  // namespace

void bind_ft(py::module_& m) {
  using ft::Quorum;
  using ft::QuorumClient;
  py::class_<Quorum>(
      m, "Quorum", "One round's quorum, as this process sees it.")
      .def_readonly("id", &Quorum::id)
      .def_readonly("round", &Quorum::round)
      .def_property_readonly(
          "members",
          [](const Quorum& q) {
            py::list out;
            for (const auto& x : q.members) {
              out.append(py::make_tuple(x.id, x.ranks, x.step));
            }
            return out;
          })
      .def_readonly("replica_rank", &Quorum::replica_rank)
      .def_readonly("replica_world_size", &Quorum::replica_world_size)
      .def_readonly("max_step", &Quorum::max_step)
      .def_readonly("step", &Quorum::step)
      .def_readonly("heal_from", &Quorum::heal_from)
      .def_readonly("heal_from_rank", &Quorum::heal_from_rank)
      .def_readonly("heal_to", &Quorum::heal_to)
      .def_readonly("store_prefix", &Quorum::store_prefix)
      .def_property_readonly("heal", &Quorum::heal);

  py::class_<QuorumClient>(m, "QuorumClient")
      .def(
          py::init([](const std::string& address,
                      const std::string& group,
                      const std::string& incarnation,
                      int group_rank,
                      int group_world_size,
                      int min_replica_size,
                      int expected_groups,
                      const py::object& join_timeout,
                      const py::object& timeout,
                      const py::object& heartbeat_interval,
                      const py::object& heartbeat_timeout,
                      int64_t step) {
            ft::QuorumOptions o{
                .group = group,
                .incarnation = incarnation,
                .group_rank = group_rank,
                .group_world_size = group_world_size,
                .min_replica_size = min_replica_size,
                .expected_groups = expected_groups,
                .join_timeout = ms(join_timeout),
                .timeout = ms(timeout),
                .heartbeat_interval = ms(heartbeat_interval),
                .heartbeat_timeout = ms(heartbeat_timeout)};
            auto t = o.timeout;
            py::gil_scoped_release release;
            return std::make_unique<QuorumClient>(
                [address, t] { return ft::connect_quorum_store(address, t); },
                std::move(o),
                step);
          }),
          py::arg("address"),
          py::arg("group"),
          py::arg("incarnation"),
          py::arg("group_rank"),
          py::arg("group_world_size"),
          py::arg("min_replica_size"),
          py::arg("expected_groups"),
          py::arg("join_timeout"),
          py::arg("timeout"),
          py::arg("heartbeat_interval"),
          py::arg("heartbeat_timeout"),
          py::arg("step"))
      .def(
          "start_quorum",
          &QuorumClient::start_quorum,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "meet", &QuorumClient::meet, py::call_guard<py::gil_scoped_release>())
      .def(
          "should_commit",
          &QuorumClient::should_commit,
          py::arg("ok"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("step", &QuorumClient::step)
      .def("healed", &QuorumClient::healed, py::arg("step"))
      .def(
          "leave",
          &QuorumClient::leave,
          py::arg("why"),
          py::call_guard<py::gil_scoped_release>());

  py::class_<ft::StateTransfer>(m, "StateTransfer")
      .def(
          py::init<const std::string&, const std::string&>(),
          py::arg("listen_host"),
          py::arg("token"))
      .def_property_readonly(
          "address",
          [](const ft::StateTransfer& t) { return py::bytes(t.address()); })
      .def(
          "send",
          [](ft::StateTransfer& t,
             const std::string& to,
             uint64_t tag,
             const std::string& meta,
             const std::vector<std::pair<uintptr_t, size_t>>& buffers,
             const py::object& timeout) {
            std::vector<std::pair<const void*, size_t>> b;
            for (auto [p, n] : buffers) {
              b.emplace_back(reinterpret_cast<const void*>(p), n);
            }
            auto t_ms = ms(timeout);
            py::gil_scoped_release release;
            t.send(to, tag, meta, b, t_ms);
          },
          py::arg("to"),
          py::arg("tag"),
          py::arg("meta"),
          py::arg("buffers"),
          py::arg("timeout"))
      .def(
          "receive_meta",
          [](ft::StateTransfer& t, uint64_t tag, const py::object& timeout) {
            auto t_ms = ms(timeout);
            std::string meta;
            {
              py::gil_scoped_release release;
              meta = t.receive_meta(tag, t_ms);
            }
            return py::bytes(meta);
          },
          py::arg("tag"),
          py::arg("timeout"))
      .def(
          "receive_into",
          [](ft::StateTransfer& t,
             uint64_t tag,
             const std::vector<std::pair<uintptr_t, size_t>>& targets,
             const py::object& timeout) {
            std::vector<std::pair<void*, size_t>> to;
            for (auto [p, n] : targets) {
              to.emplace_back(reinterpret_cast<void*>(p), n);
            }
            auto t_ms = ms(timeout);
            py::gil_scoped_release release;
            t.receive_into(tag, to, t_ms);
          },
          py::arg("tag"),
          py::arg("targets"),
          py::arg("timeout"));

  m.def(
      "declare_replica_out",
      [](const std::string& address,
         const std::string& member,
         const std::string& why) {
        py::gil_scoped_release release;
        auto s = ft::connect_quorum_store(address, std::chrono::seconds(30));
        QuorumClient::declare_dead(*s, member, why);
      },
      py::arg("address"),
      py::arg("member"),
      py::arg("why"),
      "Declares a replica group's member (GROUP:INCARNATION) out, as its "
      "agent does when it sees the member's workers end.");
  m.def(
      "connect_quorum_store",
      [](const std::string& address, const py::object& timeout) {
        auto t = ms(timeout);
        py::gil_scoped_release release;
        return ft::connect_quorum_store(address, t);
      },
      py::arg("address"),
      py::arg("timeout"));
}

}  // namespace tide::pyelastic
