#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// Real etcd processes for tests: a cluster of 1 or 3 members on 127.0.0.1,
// each with its data dir and log in a temp dir, killed and removed with the
// object.
#include "support/http.h"
#include "support/temp_dir.h"

namespace tide::test {

class EtcdCluster {
 public:
  // Starts `members` (1 or 3) members and waits until each answers /health,
  // at most 30 s. etcd cannot listen on port 0 and advertise the port it
  // got, so ports are picked at random in [20000, 32000) (below Linux's
  // ephemeral range); a member that exits with "address already in use"
  // makes the whole cluster start again on other ports. Throws
  // std::runtime_error with the members' log tails when etcd does not come
  // up.
  //
  // The members get SIGKILL when the thread that started them exits
  // (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind: start a
  // cluster from a thread that outlives it (a test's main thread).
  static EtcdCluster start(int members) {
    if (members != 1 && members != 3) {
      throw std::invalid_argument("EtcdCluster: 1 or 3 members");
    }
    EtcdCluster cluster;
    cluster.etcd_ = find_etcd();
    std::random_device seed;
    std::mt19937 rng(seed());
    std::string error;
    for (int attempt = 0; attempt < 8; ++attempt) {
      cluster.dir_ = std::make_unique<TempDir>("tide_etcd_");
      if (cluster.launch(members, rng, error)) {
        return cluster;
      }
      cluster.kill_all();
      cluster.members_.clear();
      if (error.empty()) {
        continue;  // a port was taken: again, elsewhere
      }
      throw std::runtime_error(error);
    }
    throw std::runtime_error(
        "EtcdCluster: no free ports after 8 attempts in [20000, 32000)");
  }

  EtcdCluster(EtcdCluster&& other) noexcept
      : etcd_(std::move(other.etcd_)),
        owner_(other.owner_),
        dir_(std::move(other.dir_)),
        members_(std::exchange(other.members_, {})) {}
  EtcdCluster& operator=(EtcdCluster&&) = delete;

  ~EtcdCluster() {
    // A forked child of the test that runs static destructors must not
    // kill the parent's etcd.
    if (::getpid() == owner_) {
      kill_all();
    }
  }

  int size() const {
    return static_cast<int>(members_.size());
  }

  // "127.0.0.1:p1,127.0.0.1:p2,...": every member's client URL, killed ones
  // included.
  std::string endpoints() const {
    std::string out;
    for (int i = 0; i < size(); ++i) {
      out += (i == 0 ? "" : ",") + endpoint(i);
    }
    return out;
  }

  // "127.0.0.1:p" of member i.
  std::string endpoint(int i) const {
    return "127.0.0.1:" + std::to_string(members_.at(i).client_port);
  }

  pid_t pid(int i) const {
    return members_.at(i).pid;
  }

  // SIGKILLs member i and reaps it.
  void kill(int i) {
    Member& m = members_.at(i);
    if (m.pid > 0) {
      ::kill(m.pid, SIGKILL);
      int status = 0;
      ::waitpid(m.pid, &status, 0);
      m.pid = -1;
    }
  }

  // The last lines of member i's log and output, for failure messages.
  std::string log_tail(int i, size_t lines = 20) const {
    const Member& m = members_.at(i);
    return tail(m.log, lines) + tail(m.out, lines);
  }

 private:
  struct Member {
    std::string name;
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    std::filesystem::path log;  // etcd's own log (zap)
    std::filesystem::path out;  // its stdout and stderr (flag errors)
    pid_t pid = -1;
  };

  EtcdCluster() = default;

  static std::string find_etcd() {
    if (const char* env = std::getenv("TIDE_ETCD")) {
      return env;
    }
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
    size_t begin = 0;
    while (begin <= dirs.size()) {
      size_t end = dirs.find(':', begin);
      std::string dir = dirs.substr(begin, end - begin);
      std::string candidate = (dir.empty() ? "." : dir) + "/etcd";
      if (::access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
      if (end == std::string::npos) {
        break;
      }
      begin = end + 1;
    }
    throw std::runtime_error(
        "EtcdCluster: no etcd in PATH; install etcd-server "
        "(scripts/setup.sh) or set TIDE_ETCD");
  }

  // True when port can be bound now (etcd may still lose it to a race).
  static bool port_free(uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
  }

  static std::string tail(const std::filesystem::path& file, size_t lines) {
    std::ifstream in(file);
    std::deque<std::string> last;
    for (std::string line; std::getline(in, line);) {
      last.push_back(std::move(line));
      if (last.size() > lines) {
        last.pop_front();
      }
    }
    std::string out;
    for (const auto& l : last) {
      out += "  " + l + "\n";
    }
    return out;
  }

  // Starts every member and waits for them. False with `error` empty when a
  // port was taken (try again); false with `error` set when etcd failed
  // otherwise.
  bool launch(int count, std::mt19937& rng, std::string& error) {
    error.clear();
    std::uniform_int_distribution<int> pick(20000, 31999);
    std::vector<uint16_t> ports;
    while (ports.size() < static_cast<size_t>(2 * count)) {
      auto p = static_cast<uint16_t>(pick(rng));
      if (std::find(ports.begin(), ports.end(), p) == ports.end() &&
          port_free(p)) {
        ports.push_back(p);
      }
    }
    std::string initial_cluster;
    for (int i = 0; i < count; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.client_port = ports[2 * i];
      m.peer_port = ports[2 * i + 1];
      m.log = dir_->path() / (m.name + ".log");
      m.out = dir_->path() / (m.name + ".out");
      initial_cluster += (i == 0 ? "" : ",") + m.name +
                         "=http://127.0.0.1:" + std::to_string(m.peer_port);
      members_.push_back(std::move(m));
    }
    std::string token = "tide-test-" + std::to_string(rng());
    for (Member& m : members_) {
      std::string client = "http://127.0.0.1:" + std::to_string(m.client_port);
      std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
      std::vector<std::string> argv = {
          etcd_,
          "--name=" + m.name,
          "--data-dir=" + (dir_->path() / (m.name + ".data")).string(),
          "--listen-client-urls=" + client,
          "--advertise-client-urls=" + client,
          "--listen-peer-urls=" + peer,
          "--initial-advertise-peer-urls=" + peer,
          "--initial-cluster=" + initial_cluster,
          "--initial-cluster-token=" + token,
          "--initial-cluster-state=new",
          // Logs outside the data dir, or etcd warns about a stray file.
          "--logger=zap",
          "--log-outputs=" + m.log.string(),
          // A rejoining member does not force an election.
          "--pre-vote",
          // A killed leader is replaced within about two seconds, and a
          // loaded machine's stalls start no elections (etcd's defaults).
          "--heartbeat-interval=100",
          "--election-timeout=1000",
          // Room for the store tests' 3 MiB values (default 1.5 MiB).
          "--max-request-bytes=10485760",
      };
      m.pid = spawn(argv, m.out);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::vector<bool> healthy(members_.size(), false);
    for (;;) {
      bool all = true;
      for (size_t i = 0; i < members_.size(); ++i) {
        Member& m = members_[i];
        int status = 0;
        if (::waitpid(m.pid, &status, WNOHANG) == m.pid) {
          m.pid = -1;
          std::string log = tail(m.log, 200) + tail(m.out, 200);
          if (log.find("address already in use") != std::string::npos) {
            return false;
          }
          error = "EtcdCluster: etcd " + m.name + " exited at start (status " +
                  std::to_string(status) + "); its log ends:\n" +
                  log_tail(static_cast<int>(i));
          return false;
        }
        if (!healthy[i]) {
          auto r = http_get(m.client_port, "/health", std::chrono::seconds(1));
          healthy[i] = r && r->status == 200 &&
                       r->body.find("\"health\":\"true\"") != std::string::npos;
        }
        all = all && healthy[i];
      }
      if (all) {
        return true;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        error = "EtcdCluster: " + std::to_string(count) +
                " etcd member(s) not healthy within 30 s; log tails:\n";
        for (int i = 0; i < count; ++i) {
          error += members_[i].name + ":\n" + log_tail(i);
        }
        return false;
      }
      // Polling an external process's readiness: nothing to wait on.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  static pid_t spawn(
      const std::vector<std::string>& argv, const std::filesystem::path& out) {
    // Everything the child needs is made before fork(): after it only
    // async-signal-safe calls.
    std::vector<char*> args;
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    int fd =
        ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw std::runtime_error("EtcdCluster: cannot create " + out.string());
    }
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) {
        ::_exit(1);  // the parent died before prctl
      }
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fd);
    if (pid < 0) {
      throw std::runtime_error("EtcdCluster: fork failed");
    }
    return pid;
  }

  void kill_all() {
    for (int i = 0; i < size(); ++i) {
      kill(i);
    }
  }

  std::string etcd_;
  pid_t owner_ = ::getpid();
  std::unique_ptr<TempDir> dir_;
  std::vector<Member> members_;
};

}  // namespace tide::test
