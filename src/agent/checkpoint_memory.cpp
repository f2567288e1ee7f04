#include "agent/checkpoint_memory.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "checkpoint/region.h"

extern char** environ;

namespace tide::agent::detail {
namespace {

// How long the writer may take to write the newest snapshots when the
// agent ends (a few GiB per rank to a slow disk), before it is killed.
constexpr int kFlushMs = 300'000;

}  // namespace

CheckpointMemory::CheckpointMemory(const AgentView& view, std::string shm_dir)
    : view_(view), shm_dir_(std::move(shm_dir)) {}

CheckpointMemory::~CheckpointMemory() {
  stop_writer();
}

void CheckpointMemory::start() {
  const WorkerSpec& spec = view_.spec;
  if (spec.checkpoints.memory == 0 || region_) {
    return;
  }
  if (int stale = checkpoint::remove_stale(shm_dir_); stale > 0) {
    TIDE_LOG_INFO(
        "[{}] removed {} checkpoint memory region(s) of agents that died from "
        "{}",
        spec.role,
        stale,
        shm_dir_);
  }
  region_ = std::make_unique<checkpoint::Region>(
      shm_dir_, spec.checkpoints.memory, spec.local_world_size);
  const checkpoint::Layout& l = region_->layout();
  TIDE_LOG_INFO(
      "[{}] checkpoint memory: {} in {}, two snapshots of up to {} per local "
      "rank",
      spec.role,
      human_bytes(l.bytes),
      region_->path(),
      human_bytes(l.slot_bytes - checkpoint::kHeaderBytes));
  if (!spec.checkpoints.dir.empty()) {
    start_writer();
  }
}

void CheckpointMemory::start_writer() {
  const WorkerSpec::Checkpoints& c = view_.spec.checkpoints;
  std::error_code ec;
  std::filesystem::create_directories(c.dir, ec);
  if (ec) {
    throw Error(
        "cannot create --checkpoint-dir " + c.dir + ": " + ec.message());
  }
  std::vector<std::string> args = {
      c.python,
      "-m",
      "tide.checkpoint",
      "--write-behind",
      region_->path(),
      c.dir,
      std::to_string(c.keep)};
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  // A session of its own: a ^C meant for tiderun must not cut its last
  // write short (tiderun tells it when to finish).
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID);
  int err =
      ::posix_spawnp(&writer_, argv[0], nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    throw Error(
        "cannot start the checkpoint writer (" + c.python +
        " -m tide.checkpoint): " + std::strerror(err));
  }
  writer_pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, writer_, 0)));
  TIDE_LOG_INFO(
      "[{}] checkpoint writer (pid {}): each rank's newest snapshot to {}, "
      "the last {} kept",
      view_.spec.role,
      writer_,
      c.dir,
      c.keep);
}

void CheckpointMemory::readable() {
  TIDE_LOG_WARN(
      "[{}] the checkpoint writer (pid {}) ended on its own (its error is "
      "above); snapshots are no longer written to {}",
      view_.spec.role,
      writer_,
      view_.spec.checkpoints.dir);
  ::waitpid(writer_, nullptr, WNOHANG);  // unless the agent reaped it
  writer_ = -1;
  writer_pidfd_.reset();
}

void CheckpointMemory::stop_writer() {
  if (writer_ <= 0) {
    return;
  }
  TIDE_LOG_INFO(
      "[{}] writing the newest snapshots to {}",
      view_.spec.role,
      view_.spec.checkpoints.dir);
  ::kill(writer_, SIGTERM);
  pollfd p{.fd = writer_pidfd_.get(), .events = POLLIN, .revents = 0};
  int ready = -1;
  do {
    ready = ::poll(&p, 1, kFlushMs);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {
    TIDE_LOG_WARN(
        "[{}] the checkpoint writer took over {} s to write the newest "
        "snapshots: killed; {} holds the ones before",
        view_.spec.role,
        kFlushMs / 1000,
        view_.spec.checkpoints.dir);
    ::kill(writer_, SIGKILL);
  }
  ::waitpid(writer_, nullptr, ready == 0 ? 0 : WNOHANG);
  writer_ = -1;
  writer_pidfd_.reset();
}

void CheckpointMemory::add_env(std::map<std::string, std::string>& env) const {
  if (region_) {
    env["TIDE_CHECKPOINT_REGION"] = region_->path();
  }
  if (!view_.spec.checkpoints.dir.empty()) {
    env["TIDE_CHECKPOINT_DIR"] = view_.spec.checkpoints.dir;
  }
}

}  // namespace tide::agent::detail
