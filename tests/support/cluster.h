#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

// Several tiderun agents forming one job, for the multi-node tests (on
// loopback in apps/multinode_test.cpp, across network namespaces in
// apps/netns_test.cpp). Workers print "start RANK=r WORLD_SIZE=w" (and
// optionally " MASTER_ADDR=a"); every agent's output is read line by line.
#include "net/socket.h"
#include "support/subprocess.h"

#ifndef TIDERUN_BIN
#error "support/cluster.h needs TIDERUN_BIN, the tiderun binary's path"
#endif

namespace tide::test {

// A TCP port free on 127.0.0.1 right now (it may be taken again later).
inline uint16_t free_port() {
  return net::free_port("127.0.0.1");
}

// What one worker start printed.
struct Start {
  std::string agent;
  int rank;
  int world_size;
  std::string master_addr;  // empty when the worker did not print it
};

// Writes dir/worker.sh and returns its path: a worker that prints "start
// RANK=r WORLD_SIZE=w MASTER_ADDR=a", exits 3 the first time one starts
// with RANK == fail_rank, and otherwise runs until dir/stop exists.
inline std::string write_worker(
    const std::filesystem::path& dir, int fail_rank = -1) {
  auto p = dir / "worker.sh";
  std::ofstream(p) << "#!/bin/sh\n"
                   << "echo \"start RANK=$RANK WORLD_SIZE=$WORLD_SIZE "
                      "MASTER_ADDR=$MASTER_ADDR\"\n"
                   << "if [ \"$RANK\" = \"" << fail_rank << "\" ] && [ ! -e "
                   << (dir / "failed") << " ]; then touch " << (dir / "failed")
                   << "; exit 3; fi\n"
                   << "while [ ! -e " << (dir / "stop")
                   << " ]; do sleep 0.05; done\n";
  std::filesystem::permissions(p, std::filesystem::perms::owner_all);
  return p.string();
}

// Writes dir/name and returns its path: a worker that prints "start
// RANK=r WORLD_SIZE=w", then exits 0 at once, or, when `fail_when` is given,
// waits for that file to exist and exits 3.
inline std::string write_ending_worker(
    const std::filesystem::path& dir,
    const std::string& name,
    const std::filesystem::path& fail_when = {}) {
  auto p = dir / name;
  std::ofstream out(p);
  out << "#!/bin/sh\n"
      << "echo \"start RANK=$RANK WORLD_SIZE=$WORLD_SIZE\"\n";
  if (!fail_when.empty()) {
    out << "while [ ! -e " << fail_when << " ]; do sleep 0.05; done\n"
        << "exit 3\n";
  }
  out.close();
  std::filesystem::permissions(p, std::filesystem::perms::owner_all);
  return p.string();
}

// The output of every agent, collected by one reader thread per agent.
// Not thread safe except for the wait_*, starts() and log() calls.
class Cluster {
 public:
  explicit Cluster(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~Cluster() {
    // Kill what is left and let the readers see EOF before the processes
    // (and the pipes the readers read) go away.
    for (auto& [name, p] : agents_) {
      p->signal(SIGKILL);
    }
    for (auto& t : readers_) {
      t.join();
    }
    agents_.clear();
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts `prefix... tiderun --log-dir DIR args...` as agent `name` (a
  // name not used before: its output lines are tagged "name| "). The
  // prefix runs tiderun elsewhere, e.g. `ip netns exec NS`; it must exec
  // tiderun so that agent(name) signals tiderun itself.
  void start(
      const std::string& name,
      std::vector<std::string> args,
      const std::vector<std::string>& prefix = {}) {
    args.insert(
        args.begin(),
        {TIDERUN_BIN, "--log-dir", (dir_ / ("logs-" + name)).string()});
    args.insert(args.begin(), prefix.begin(), prefix.end());
    auto p = std::make_unique<Subprocess>(
        args, SubprocessOptions{.merge_stderr = true});
    Subprocess* raw = p.get();
    agents_[name] = std::move(p);
    readers_.emplace_back([this, raw, name] {
      using namespace std::chrono_literals;
      while (auto line = raw->read_line(120s)) {
        std::lock_guard lock(mutex_);
        log_ += name + "| " + *line + "\n";
        static const std::regex start(
            R"(start RANK=(\d+) WORLD_SIZE=(\d+)(?: MASTER_ADDR=(\S*))?)");
        std::smatch m;
        if (std::regex_search(*line, m, start)) {
          starts_.push_back(Start{
              name, std::stoi(m[1].str()), std::stoi(m[2].str()), m[3].str()});
        }
        lines_.push_back(name + "| " + *line);
        cv_.notify_all();
      }
    });
  }

  // Ends write_worker's workers (the stop file in this cluster's dir) and
  // expects each named agent to exit 0.
  void stop_all(const std::vector<std::string>& names) {
    using namespace std::chrono_literals;
    std::ofstream(dir_ / "stop") << "";
    for (const auto& n : names) {
      auto status = agent(n).wait(30s);
      ASSERT_TRUE(status.has_value()) << n << "\n" << log();
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << n << "\n"
                                                                   << log();
    }
  }

  Subprocess& agent(const std::string& name) {
    return *agents_.at(name);
  }

  // Waits until `count` worker starts after the first `from` have world size
  // `world`; returns them.
  std::vector<Start> wait_starts(
      size_t from, int world, size_t count, std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    std::vector<Start> found;
    cv_.wait_for(lock, limit, [&] {
      found.clear();
      for (size_t i = from; i < starts_.size(); ++i) {
        if (starts_[i].world_size == world) {
          found.push_back(starts_[i]);
        }
      }
      return found.size() >= count;
    });
    return found;
  }

  // Whether a line holding `needle` came within `limit`. A line an agent
  // printed before it exited may still be on its way through the reader:
  // wait for it as for any other, with a deadline a loaded machine meets.
  bool wait_line(const std::string& needle, std::chrono::seconds limit) {
    return wait_any_line({needle}, limit);
  }

  // Whether a line holding any of `needles` came within `limit`.
  bool wait_any_line(
      const std::vector<std::string>& needles, std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, limit, [&] {
      for (const auto& l : lines_) {
        for (const auto& needle : needles) {
          if (l.find(needle) != std::string::npos) {
            return true;
          }
        }
      }
      return false;
    });
  }

  size_t starts() {
    std::lock_guard lock(mutex_);
    return starts_.size();
  }

  std::string log() {
    std::lock_guard lock(mutex_);
    return log_;
  }

 private:
  std::filesystem::path dir_;
  std::map<std::string, std::unique_ptr<Subprocess>> agents_;
  std::vector<std::thread> readers_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Start> starts_;
  std::vector<std::string> lines_;
  std::string log_;
};

// The starts' ranks are exactly 0..world-1, and none is on agent `gone`
// (when given).
inline void expect_ranks(
    const std::vector<Start>& starts, int world, std::string_view gone = {}) {
  std::set<int> ranks;
  for (const auto& s : starts) {
    ranks.insert(s.rank);
    if (!gone.empty()) {
      EXPECT_NE(s.agent, gone);
    }
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(world));
  if (!ranks.empty()) {
    EXPECT_EQ(*ranks.begin(), 0);
    EXPECT_EQ(*ranks.rbegin(), world - 1);
  }
}

// The exit code of a wait status, or -1 when the process was signalled.
inline int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Two nodes whose workers end differently: node "a"'s succeed at once, node
// "b"'s fail for good once "a" is in its exit barrier. `start(name, script)`
// starts an agent (a first, so that with c10d it hosts the store). Expects b
// to exit 1, and a to exit 0 within `bound` of b's exit, saying why it left
// the barrier early.
template <typename Start>
void expect_finished_node_leaves_when_peer_fails(
    Cluster& c,
    const std::filesystem::path& dir,
    Start start,
    std::chrono::seconds bound) {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  auto fail_now = dir / "fail-now";
  start("a", write_ending_worker(dir, "ok.sh"));
  start("b", write_ending_worker(dir, "fail.sh", fail_now));
  ASSERT_TRUE(c.wait_line("all workers succeeded", 60s)) << c.log();
  ASSERT_TRUE(c.wait_line("b| start RANK=", 60s)) << c.log();
  std::ofstream(fail_now) << "";
  auto b = c.agent("b").wait(30s);
  auto b_exited = Clock::now();
  ASSERT_TRUE(b.has_value()) << c.log();
  EXPECT_EQ(exit_code(*b), 1) << c.log();
  auto a = c.agent("a").wait(bound);
  auto a_later = Clock::now() - b_exited;
  ASSERT_TRUE(a.has_value()) << "a still in its exit barrier " << bound.count()
                             << " s after b failed\n"
                             << c.log();
  EXPECT_EQ(exit_code(*a), 0) << c.log();
  EXPECT_LT(a_later, bound) << c.log();
  // Printed before a exited; its reader may still be behind.
  EXPECT_TRUE(c.wait_any_line(
      {"exit barrier: every node has ended",
       "exit barrier: the rendezvous is closed"},
      30s))
      << c.log();
  std::printf(
      "the finished node exited %.0f ms after the failed one\n",
      std::chrono::duration<double, std::milli>(a_later).count());
}

}  // namespace tide::test
