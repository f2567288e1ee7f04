#include "agent/prestart.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"

namespace tide::agent::detail {

namespace {

// What a prestarted interpreter runs (`python -u -c`): the imports (a gated
// one first waits on descriptor 3 for "go", and imports nothing when its
// work comes first), then it waits on descriptor 3 for its work and its
// output descriptors, takes the worker's environment, working directory and
// argv, and runs the script as `python -u script.py` / `python -u -m
// module` would. A failure (an uncaught exception, a non-zero exit) ends the
// process as multiprocessing's children end: atexit handlers, streams
// flushed, then _exit, without the interpreter's teardown (170 ms with torch
// and a process group), so the agent learns of it at once; success exits as
// Python does.
constexpr const char* kBootstrap = R"PY(
import os, sys
def _tide_wait():
    import array, json, socket
    channel = socket.socket(fileno=3)
    warm = True
    if os.environ.pop("TIDE_PRESTART_GATED", ""):
        # Warms up once the agent says go; handed its work first, it does not.
        warm = channel.recv(16, socket.MSG_PEEK) == b"go"
        if warm:
            channel.recv(16)
    imports = os.environ.pop("TIDE_PRESTART_IMPORTS", "")
    for name in filter(None, imports.split(",") if warm else ()):
        __import__(name)
    if warm and os.environ.get("TIDE_CHECKPOINT_REGION"):
        try:
            import tide.checkpoint  # maps the node's checkpoints while idle
        except Exception:
            pass
    fds = array.array("i")
    msg, ancillary, _, _ = channel.recvmsg(1 << 22, socket.CMSG_LEN(2 * fds.itemsize))
    if not msg:
        os._exit(0)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    work = json.loads(msg)
    os.environ.clear()
    os.environ.update(work["env"])
    os.chdir(work["cwd"])
    return work
def _tide_exit_now(code):
    import atexit, threading
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
def _tide_report():
    kind, value, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith("<"):
        tb = tb.tb_next
    sys.excepthook(kind, value.with_traceback(tb), tb)
def _tide_run(work):
    import runpy
    sys.argv = [work["target"]] + work["args"]
    try:
        if work["module"]:
            sys.path[0] = os.getcwd()
            runpy.run_module(work["target"], run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.realpath(work["target"]))
            runpy.run_path(work["target"], run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or code == 0:
            raise
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        _tide_exit_now(code)
    except KeyboardInterrupt:
        _tide_report()
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        _tide_report()
        _tide_exit_now(1)
_tide_run(_tide_wait())
)PY";

std::vector<std::string> import_time_env(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  for (const auto& e : env) {
    if (!PrestartPool::per_attempt(e.substr(0, e.find('=')))) {
      out.push_back(e);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The first variable set differently in a and b (both sorted), by name.
std::string first_difference(
    const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> diff;
  std::set_symmetric_difference(
      a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  return diff.empty() ? "" : diff.front().substr(0, diff.front().find('='));
}

bool same_binding(
    const std::optional<Binding>& a, const std::optional<Binding>& b) {
  if (a.has_value() != b.has_value()) {
    return false;
  }
  return !a || (a->cpus == b->cpus && a->mem_nodes == b->mem_nodes);
}

}  // namespace

std::optional<PythonCommand> PythonCommand::parse(
    const std::string& resolved_path,
    const std::vector<std::string>& argv,
    std::string* why_not) {
  // tiderun's forms: PYTHON -u SCRIPT ARGS... and PYTHON -u -m MODULE ARGS...
  if (argv.size() < 3 || argv[1] != "-u") {
    *why_not = "the workers' command is not a Python script (--no-python?)";
    return std::nullopt;
  }
  PythonCommand c{.python = resolved_path};
  size_t i = 2;
  if (argv[2] == "-m") {
    if (argv.size() < 4) {
      *why_not = "no module after -m";
      return std::nullopt;
    }
    c.module = true;
    i = 3;
  }
  c.target = argv[i];
  c.args.assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
  return c;
}

bool PrestartPool::per_attempt(const std::string& name) {
  static const std::set<std::string> names = {
      "LOCAL_RANK",
      "RANK",
      "GROUP_RANK",
      "ROLE_RANK",
      "WORLD_SIZE",
      "GROUP_WORLD_SIZE",
      "ROLE_WORLD_SIZE",
      "MASTER_ADDR",
      "MASTER_PORT",
      "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_ERROR_FILE",
      "TIDE_RPC_TOKEN",
  };
  return names.count(name) > 0;
}

PrestartPool::PrestartPool(Options options, Janitor* janitor)
    : options_(std::move(options)), janitor_(janitor) {}

PrestartPool::~PrestartPool() {
  drain();
}

void PrestartPool::drain() {
  // Their processes are killed as they are destroyed.
  waiting_.clear();
}

bool PrestartPool::reaped(pid_t pid, int wait_status) {
  for (Waiting& w : waiting_) {
    if (w.process->pid() == pid) {
      w.process->set_status(wait_status);
      return true;
    }
  }
  return false;
}

void PrestartPool::fill(
    const std::string& python,
    const std::vector<LaunchSpec>& slots,
    bool gated) {
  // An interpreter that died waiting (killed, an import that failed) is
  // replaced.
  std::erase_if(waiting_, [this](Waiting& w) {
    if (w.process->poll_exit()) {
      TIDE_LOG_WARN(
          "prestarted interpreter {} ended before it was used (exit {}); its "
          "output is in {}",
          w.process->pid(),
          w.process->exitcode(),
          options_.log_dir);
      return true;
    }
    return false;
  });
  for (const LaunchSpec& slot : slots) {
    bool have = std::any_of(waiting_.begin(), waiting_.end(), [&](auto& w) {
      return w.local_rank == slot.local_rank;
    });
    if (!have) {
      start(python, slot, slot.local_rank, gated);
    }
  }
  if (slots.empty() || slots.front().binding) {
    return;  // spares serve any rank: not with per-rank CPU binding
  }
  auto spares = std::count_if(waiting_.begin(), waiting_.end(), [](auto& w) {
    return w.local_rank < 0;
  });
  for (auto n = spares; n < options_.spares; ++n) {
    start(python, slots.front(), -1, gated);
  }
}

void PrestartPool::release() {
  for (Waiting& w : waiting_) {
    // One that died is found out when taken.
    if (w.gated &&
        ::send(w.channel.get(), "go", 2, MSG_NOSIGNAL | MSG_DONTWAIT) == 2) {
      w.gated = false;
    }
  }
}

void PrestartPool::start(
    const std::string& python,
    const LaunchSpec& slot,
    int local_rank,
    bool gated) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw Error(std::string("socketpair failed: ") + std::strerror(errno));
  }
  Fd ours(sv[0]);
  Fd theirs(sv[1]);
  Waiting w;
  w.local_rank = local_rank;
  w.env = import_time_env(slot.env);
  w.binding = slot.binding;
  LaunchSpec ls;
  ls.local_rank = local_rank < 0 ? 0 : local_rank;
  ls.path = python;
  ls.argv = {python, "-u", "-c", kBootstrap};
  ls.env = w.env;
  std::string imports;
  for (const auto& m : options_.imports) {
    imports += (imports.empty() ? "" : ",") + m;
  }
  ls.env.push_back("TIDE_PRESTART_IMPORTS=" + imports);
  if (gated) {
    ls.env.emplace_back("TIDE_PRESTART_GATED=1");
  }
  w.gated = gated;
  std::filesystem::create_directories(options_.log_dir);
  std::string log =
      options_.log_dir + "/" + std::to_string(started_++) + ".log";
  ls.out = {.mode = StreamTarget::Mode::kFile, .path = log};
  ls.err = {.mode = StreamTarget::Mode::kFile, .path = log};
  ls.binding = slot.binding;
  ls.keep_fd = theirs.get();
  w.process = std::make_unique<WorkerProcess>(ls, janitor_);
  w.channel = std::move(ours);
  TIDE_LOG_DEBUG(
      "prestarted interpreter {} for {} (importing {})",
      w.process->pid(),
      local_rank < 0 ? std::string("a spare")
                     : "local rank " + std::to_string(local_rank),
      imports);
  waiting_.push_back(std::move(w));
}

std::unique_ptr<WorkerProcess> PrestartPool::take(
    const LaunchSpec& spec, const PythonCommand& cmd, std::string* why_not) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](auto& w) {
    return w.local_rank == spec.local_rank;
  });
  if (it == waiting_.end()) {
    it = std::find_if(waiting_.begin(), waiting_.end(), [](auto& w) {
      return w.local_rank < 0;
    });
  }
  if (it == waiting_.end()) {
    *why_not = "no prestarted interpreter is waiting";
    return nullptr;
  }
  Waiting w = std::move(*it);
  waiting_.erase(it);
  if (w.process->poll_exit()) {
    *why_not = "the prestarted interpreter ended (exit " +
               std::to_string(w.process->exitcode()) + ")";
    return nullptr;
  }
  std::vector<std::string> env = import_time_env(spec.env);
  if (std::string var = first_difference(w.env, env); !var.empty()) {
    *why_not = "its environment at start differs from the worker's in " + var +
               ", which may be read at import time";
    return nullptr;
  }
  if (!same_binding(w.binding, spec.binding)) {
    *why_not = "its CPU and memory binding differs from the worker's";
    return nullptr;
  }

  auto [out, err] = w.process->retarget(spec);
  nlohmann::json env_map = nlohmann::json::object();
  for (const auto& e : spec.env) {
    auto eq = e.find('=');
    env_map[e.substr(0, eq)] = eq == std::string::npos ? "" : e.substr(eq + 1);
  }
  std::string body =
      nlohmann::json{
          {"module", cmd.module},
          {"target", cmd.target},
          {"args", cmd.args},
          {"env", env_map},
          {"cwd", std::filesystem::current_path().string()},
      }
          .dump();
  int fds[2] = {
      out ? out.get() : STDOUT_FILENO, err ? err.get() : STDERR_FILENO};
  iovec iov{.iov_base = body.data(), .iov_len = body.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  if (::sendmsg(w.channel.get(), &msg, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(body.size())) {
    *why_not = std::string("the hand-off failed: ") + std::strerror(errno);
    return nullptr;
  }
  return std::move(w.process);
}

}  // namespace tide::agent::detail
