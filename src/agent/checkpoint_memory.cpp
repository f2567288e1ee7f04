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
#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "checkpoint/peer_copy.h"
#include "checkpoint/region.h"
#include "common/clock.h"
#include "common/random.h"

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
  peers_.reset();  // before the region it reads
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
      shm_dir_,
      spec.checkpoints.memory,
      spec.local_world_size,
      spec.checkpoints.peer);
  const checkpoint::Layout& l = region_->layout();
  TIDE_LOG_INFO(
      "[{}] checkpoint memory: {} in {}, {} snapshots of up to {} per local "
      "rank{}",
      spec.role,
      human_bytes(l.bytes),
      region_->path(),
      l.own == 2 ? "two" : "three",
      human_bytes(l.slot_bytes - checkpoint::kHeaderBytes),
      spec.checkpoints.peer ? ", and two of a peer node's" : "");
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

void CheckpointMemory::entered(const Transition& t) {
  if (t.event != GroupEvent::kStarted || !region_ ||
      !view_.spec.checkpoints.peer) {
    return;
  }
  meet_peers();
  fetch_missing();
}

std::string CheckpointMemory::round_prefix() const {
  return "tide/checkpoint/round" + std::to_string(view_.rdzv.round) + "/";
}

void CheckpointMemory::meet_peers() {
  const WorkerSpec& spec = view_.spec;
  const rendezvous::RendezvousInfo& rdzv = view_.rdzv;
  store::Store& store = *rdzv.store;
  // The job's secret, else one agreed through the round's store (as the
  // workers' rpc secret is, with the same warning in the log): the first
  // agent's, which may be a new node's; the others take it.
  std::string token = spec.job_secret;
  if (token.empty()) {
    token = store.compare_set(
        "tide/checkpoint/secret", "", peers_ ? token_ : random_id(43));
  }
  if (!peers_ || token != token_) {
    peers_.reset();
    token_ = token;
    peers_ = std::make_unique<checkpoint::PeerCopy>(
        *region_, checkpoint::PeerCopyOptions{.token = token});
  }
  const std::string prefix = round_prefix();
  const std::string& host =
      spec.checkpoints.host.empty() ? fqdn() : spec.checkpoints.host;
  store.set(
      prefix + std::to_string(rdzv.rank),
      std::to_string(peers_->id()) + " " + std::to_string(peers_->port()) +
          " " + host);
  std::vector<std::string> keys;
  for (int r = 0; r < rdzv.world_size; ++r) {
    keys.push_back(prefix + std::to_string(r));
  }
  std::vector<checkpoint::PeerNode> nodes;
  std::vector<std::string> values = store.multi_get(keys);
  for (int r = 0; r < rdzv.world_size; ++r) {
    auto fields = split(values[static_cast<size_t>(r)], ' ');
    if (fields.size() != 3) {
      throw Error(
          "the checkpoint address of node " + std::to_string(r) + " is '" +
          values[static_cast<size_t>(r)] + "', not 'ID PORT HOST'");
    }
    nodes.push_back(checkpoint::PeerNode{
        .rank = r,
        .id = std::stoi(std::string(fields[0])),
        .host = std::string(fields[2]),
        .port = static_cast<uint16_t>(std::stoi(std::string(fields[1])))});
  }
  int peer = rdzv.world_size > 1 ? (rdzv.rank + 1) % rdzv.world_size : -1;
  peers_->set_round(rdzv.rank, std::move(nodes), peer);
  // This node takes the round's peers now: a fetch from it is no longer
  // refused as one from a stranger (see fetch_missing).
  store.set(prefix + "ready/" + std::to_string(rdzv.rank), "");
  if (peer >= 0) {
    TIDE_LOG_INFO(
        "[{}] checkpoint copies: this node's to node {}, node {}'s here",
        spec.role,
        peer,
        (rdzv.rank + rdzv.world_size - 1) % rdzv.world_size);
  }
}

void CheckpointMemory::fetch_missing() {
  const WorkerSpec& spec = view_.spec;
  if (view_.rdzv.world_size < 2) {
    return;
  }
  const checkpoint::Layout& l = region_->layout();
  std::map<int64_t, int> lacking;
  for (const Worker& w : view_.group.workers) {
    lacking[w.global_rank] = w.local_rank;
  }
  // Held in this node's own slots. A rank held only among the copies kept
  // for the peer node is asked for too: those may be one snapshot (one the
  // peer pushed before it learnt the rank is now this node's), while the
  // node it comes from holds all of them.
  for (uint32_t s = 0; s < l.replicas_from; ++s) {
    checkpoint::SlotHead h = region_->head(s);
    if (h.state == checkpoint::kComplete) {
      lacking.erase(h.rank);
    }
  }
  if (lacking.empty()) {
    return;
  }
  // The others must have taken this round's peers before this node asks
  // them: one still on the round before refuses a node it does not know.
  const std::string prefix = round_prefix();
  std::vector<std::string> ready;
  for (int r = 0; r < view_.rdzv.world_size; ++r) {
    if (r != view_.rdzv.rank) {
      ready.push_back(prefix + "ready/" + std::to_string(r));
    }
  }
  try {
    view_.rdzv.store->wait(ready, kPeersReadyTimeout);
  } catch (const TimeoutError& e) {
    TIDE_LOG_WARN(
        "[{}] the other nodes did not take this round's checkpoint peers in "
        "time ({}); fetching anyway",
        spec.role,
        e.what());
  }
  auto start = Clock::now();
  checkpoint::FetchResult fetched = peers_->fetch(lacking);
  double s = std::chrono::duration<double>(Clock::now() - start).count();
  for (const checkpoint::Fetched& f : fetched.got) {
    std::string steps;
    for (int64_t step : f.steps) {
      steps += (steps.empty() ? "" : ", ") + std::to_string(step);
    }
    TIDE_LOG_INFO(
        "[{}] rank {}: snapshots of steps {} ({}) from node {} in {:.0f} ms "
        "({:.2f} GB/s)",
        spec.role,
        f.rank,
        steps,
        human_bytes(f.bytes),
        f.from,
        s * 1e3,
        s > 0 ? static_cast<double>(f.bytes) / s / 1e9 : 0.0);
  }
  if (!fetched.error.empty()) {
    TIDE_LOG_WARN(
        "[{}] fetching the snapshots of this node's ranks: {}; the workers "
        "load what else there is",
        spec.role,
        fetched.error);
  }
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
