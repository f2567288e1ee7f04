// tide._elastic's timers: tide's local (Unix socket) and file (FIFO) timer
// servers, signalling only the launcher's own workers, and their clients.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"

#include "pyelastic/py_common.h"

namespace tide::pyelastic {

using std::chrono::milliseconds;

namespace {

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

}  // namespace

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

}  // namespace tide::pyelastic
