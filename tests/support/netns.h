#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// Test "hosts" on one machine: Linux network namespaces wired to a private
// bridge (the layout of reference/components.md §2.1). Needs root.
#include "support/process_checks.h"
#include "support/subprocess.h"

namespace tide::test {

// N hosts on one private Ethernet segment. Host i (0-based) is the network
// namespace name(i), with `lo` up and `eth0` at addr(i) = 10.R.0.(i+1)/24.
// Each eth0 is a veth whose peer, sw<i>, is a port of the bridge br0 in a
// "switch" namespace of its own: the root namespace gets no interface,
// address or route, and each host's only route is 10.R.0.0/24 via eth0, so
// nothing sent on this network can leave the bridge.
//
// Never talk to addr(i) from the root namespace: its default route leaves
// the machine. Run every program that uses these addresses inside a host,
// with exec_prefix(i). The filesystem is shared, so files under /tmp work
// across hosts.
//
// Namespace names (global on the machine) carry this process's pid and a
// per-process counter, so concurrent test processes and fixtures never
// collide; interface names (eth0, br0, sw<i>) are per namespace. R is drawn
// at random in [16, 240) per fixture, so logs of concurrent runs can be told
// apart (isolation does not depend on it: every fixture has its own
// bridge); it stays off 10.255/16, where this sandbox's DNS server is, so
// a lookup from a host fails at once (no route) instead of waiting on ARP.
//
// Not thread safe. The constructor, isolate() and reconnect() run `ip` and
// block until it ends (bounded by kIpTimeout); a failed `ip` throws
// std::runtime_error with the command and its output. The destructor kills
// every process left inside the namespaces, then removes the veths, the
// bridge and the namespaces; it never throws (failures go to stderr). A
// test process killed outright leaves its namespaces behind (`ip netns
// list`, prefix "tide<pid>-").
class NetnsHosts {
 public:
  static constexpr const char* kIp = "/usr/bin/ip";
  static constexpr std::chrono::seconds kIpTimeout{30};

  // Creates `hosts` hosts (1..253). Throws std::invalid_argument on a bad
  // count, std::runtime_error (after removing what it made) when an `ip`
  // command fails.
  explicit NetnsHosts(int hosts)
      : prefix_(
            "tide" + std::to_string(::getpid()) + "-" +
            std::to_string(next_fixture()++)),
        subnet_(16 + static_cast<int>(std::random_device{}() % 224)),
        hosts_(hosts) {
    if (hosts < 1 || hosts > 253) {
      throw std::invalid_argument(
          "NetnsHosts: 1 to 253 hosts, not " + std::to_string(hosts));
    }
    try {
      add_namespace(switch_name());
      ip({"-n", switch_name(), "link", "add", "br0", "type", "bridge"});
      links_.emplace_back(switch_name(), "br0");
      ip({"-n", switch_name(), "link", "set", "br0", "up"});
      for (int i = 0; i < hosts_; ++i) {
        std::string port = "sw" + std::to_string(i);
        add_namespace(name(i));
        // Both ends are created straight in their namespaces.
        ip({"link",
            "add",
            "eth0",
            "netns",
            name(i),
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            switch_name()});
        links_.emplace_back(name(i), "eth0");
        ip({"-n", name(i), "addr", "add", addr(i) + "/24", "dev", "eth0"});
        ip({"-n", name(i), "link", "set", "lo", "up"});
        ip({"-n", name(i), "link", "set", "eth0", "up"});
        ip({"-n", switch_name(), "link", "set", port, "master", "br0"});
        ip({"-n", switch_name(), "link", "set", port, "up"});
      }
    } catch (...) {
      teardown();
      throw;
    }
  }

  ~NetnsHosts() {
    teardown();
  }
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  // Whether hosts can be made here: we are root and a probe namespace with
  // a bridge and a veth pair can be created and removed. Checked once per
  // process; `why` gets the reason when not.
  static bool available(std::string* why = nullptr) {
    static const std::string reason = probe();
    if (why != nullptr) {
      *why = reason;
    }
    return reason.empty();
  }

  int size() const {
    return hosts_;
  }

  // Host i's namespace name.
  std::string name(int i) const {
    return prefix_ + "h" + std::to_string(check_index(i));
  }

  // Host i's address, "10.R.0.(i+1)".
  std::string addr(int i) const {
    return "10." + std::to_string(subnet_) + ".0." +
           std::to_string(check_index(i) + 1);
  }

  // Prepend to an argv to run it on host i. `ip netns exec` execs the
  // program (no fork), so the pid of what runs is the program's own.
  std::vector<std::string> exec_prefix(int i) const {
    return {kIp, "netns", "exec", name(i)};
  }

  // Unplugs host i: its eth0 goes down, so it reaches nobody and nobody
  // reaches it (its processes keep running). Sends from the host fail at
  // once (no route); sends to it are dropped silently.
  void isolate(int i) {
    ip({"-n", name(i), "link", "set", "eth0", "down"});
  }

  // Plugs host i back in (undoes isolate()).
  void reconnect(int i) {
    ip({"-n", name(i), "link", "set", "eth0", "up"});
  }

 private:
  struct IpResult {
    bool ok = false;
    std::string output;   // stdout and stderr
    std::string failure;  // why it failed, for messages
  };

  static std::atomic<int>& next_fixture() {
    static std::atomic<int> n{0};
    return n;
  }

  // Runs `ip args...` and waits for it (kIpTimeout).
  static IpResult run_ip(const std::vector<std::string>& args) {
    std::vector<std::string> argv{kIp};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string command;
    for (const auto& a : argv) {
      command += (command.empty() ? "" : " ") + a;
    }
    IpResult r;
    try {
      Subprocess p(argv, SubprocessOptions{.merge_stderr = true});
      r.output = p.read_all(kIpTimeout);
      std::optional<int> status = p.wait(kIpTimeout);
      if (!status) {
        r.failure = "`" + command + "` did not finish within " +
                    std::to_string(kIpTimeout.count()) + " s";
      } else if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
        r.failure =
            "`" + command + "` failed (" +
            (WIFEXITED(*status)
                 ? "exit " + std::to_string(WEXITSTATUS(*status))
                 : "signal " + std::to_string(WTERMSIG(*status))) +
            "): " + r.output.substr(0, r.output.find_last_not_of("\n") + 1);
      } else {
        r.ok = true;
      }
    } catch (const std::exception& e) {
      r.failure = "`" + command + "` could not run: " + e.what();
    }
    return r;
  }

  // `ip args...`; throws std::runtime_error naming the command when it
  // fails.
  static std::string ip(const std::vector<std::string>& args) {
    IpResult r = run_ip(args);
    if (!r.ok) {
      throw std::runtime_error("NetnsHosts: " + r.failure);
    }
    return r.output;
  }

  // Removes the namespaces of test processes that died without cleaning
  // up (SIGKILL, a crash): names are tide<pid>-..., and that pid is gone.
  static void sweep_stale() {
    IpResult list = run_ip({"netns", "list"});
    if (!list.ok) {
      return;
    }
    std::istringstream lines(list.output);
    std::string ns;
    std::string rest;
    while (lines >> ns && std::getline(lines, rest)) {
      if (ns.rfind("tide", 0) != 0) {
        continue;
      }
      size_t dash = ns.find('-');
      std::string pid = ns.substr(4, dash == std::string::npos ? 0 : dash - 4);
      if (pid.empty() ||
          pid.find_first_not_of("0123456789") != std::string::npos ||
          std::filesystem::exists("/proc/" + pid)) {
        continue;
      }
      IpResult pids = run_ip({"netns", "pids", ns});
      std::istringstream in(pids.output);
      for (pid_t p = 0; in >> p;) {
        ::kill(p, SIGKILL);
      }
      run_ip({"netns", "del", ns});
    }
  }

  static std::string probe() {
    if (::geteuid() != 0) {
      return "not root: network namespaces, veths and bridges need "
             "CAP_SYS_ADMIN and CAP_NET_ADMIN";
    }
    if (::access(kIp, X_OK) != 0) {
      return std::string(kIp) + " (iproute2) is missing";
    }
    sweep_stale();
    std::string ns = "tide" + std::to_string(::getpid()) + "-probe";
    IpResult added = run_ip({"netns", "add", ns});
    if (!added.ok) {
      return added.failure;
    }
    std::string why;
    for (std::vector<std::string> args :
         {std::vector<std::string>{"link", "add", "br0", "type", "bridge"},
          std::vector<std::string>{
              "link", "add", "v0", "type", "veth", "peer", "name", "v1"}}) {
      args.insert(args.begin(), {"-n", ns});
      if (IpResult r = run_ip(args); !r.ok) {
        why = r.failure;
        break;
      }
    }
    // The links go with the namespace.
    if (IpResult r = run_ip({"netns", "del", ns}); !r.ok && why.empty()) {
      why = r.failure;
    }
    return why;
  }

  std::string switch_name() const {
    return prefix_ + "sw";
  }

  int check_index(int i) const {
    if (i < 0 || i >= hosts_) {
      throw std::out_of_range(
          "NetnsHosts: no host " + std::to_string(i) + " (there are " +
          std::to_string(hosts_) + ")");
    }
    return i;
  }

  void add_namespace(const std::string& ns) {
    ip({"netns", "add", ns});
    namespaces_.push_back(ns);
  }

  // Best effort and idempotent: each step runs even when one before failed.
  void teardown() noexcept {
    auto complain = [](const std::string& what) {
      std::fprintf(stderr, "NetnsHosts: cleanup: %s\n", what.c_str());
    };
    try {
      // Processes first: a namespace with processes in it outlives
      // `ip netns del`, and so do its links.
      std::vector<pid_t> killed;
      for (const auto& ns : namespaces_) {
        IpResult r = run_ip({"netns", "pids", ns});
        if (!r.ok) {
          complain(r.failure);
          continue;
        }
        std::istringstream pids(r.output);
        pid_t pid = 0;
        while (pids >> pid) {
          if (pid > 1 && pid != ::getpid() && ::kill(pid, SIGKILL) == 0) {
            killed.push_back(pid);
          }
        }
      }
      for (pid_t pid : killed) {
        if (!process_gone_within(pid, std::chrono::seconds(10))) {
          complain("process " + std::to_string(pid) + " outlived SIGKILL");
        }
      }
      // Deleting a veth end deletes its peer in the switch namespace.
      for (auto it = links_.rbegin(); it != links_.rend(); ++it) {
        IpResult r = run_ip({"-n", it->first, "link", "del", it->second});
        if (!r.ok) {
          complain(r.failure);
        }
      }
      links_.clear();
      for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
        IpResult r = run_ip({"netns", "del", *it});
        if (!r.ok) {
          complain(r.failure);
        }
      }
      namespaces_.clear();
    } catch (const std::exception& e) {
      complain(e.what());
    }
  }

  std::string prefix_;
  int subnet_;
  int hosts_;
  // What was created, in order: removed in reverse.
  std::vector<std::string> namespaces_;
  std::vector<std::pair<std::string, std::string>> links_;  // (netns, dev)
};

}  // namespace tide::test
