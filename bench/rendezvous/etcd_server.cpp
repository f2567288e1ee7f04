#include "etcd_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace tide::bench {
namespace {

constexpr int kPortAttempts = 5;
constexpr auto kHealthPoll = std::chrono::milliseconds(10);
// etcd's own stop takes 5-11 ms; this is the bound before SIGKILL.
constexpr int64_t kStopGraceNs = 2'000'000'000;

// GET /health over HTTP/1.0 (the server closes after its reply); whether it
// says {"health":"true"}. False when nothing listens yet.
bool healthy(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return false;
  }
  timeval tv{.tv_sec = 1, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[1024];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
        reply.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  return reply.find("\"health\":\"true\"") != std::string::npos;
}

}  // namespace

EtcdServer::EtcdServer(const std::string& etcd, double start_timeout_s)
    : dir_("rendezvous_bench_etcd") {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> port(20000, 39999);
  for (int attempt = 0; attempt < kPortAttempts && !child_; ++attempt) {
    auto client = static_cast<uint16_t>(port(rng));
    auto peer = static_cast<uint16_t>(client + 20000);
    child_ = try_start(etcd, client, peer, start_timeout_s);
    if (child_) {
      client_port_ = client;
    }
  }
  if (!child_) {
    throw std::runtime_error(fmt::format(
        "etcd: {} tries found no free pair of ports; its log ends: {}",
        kPortAttempts,
        log_tail()));
  }
}

EtcdServer::~EtcdServer() {
  stop();
}

std::string EtcdServer::endpoint() const {
  return fmt::format("127.0.0.1:{}", client_port_);
}

void EtcdServer::stop() noexcept {
  if (child_) {
    child_->stop();
  }
}

double EtcdServer::cpu_seconds() const {
  return child_ ? cpu_seconds_of(child_->pid()) : 0;
}

std::unique_ptr<Child> EtcdServer::try_start(
    const std::string& etcd, uint16_t client, uint16_t peer, double timeout_s) {
  std::string client_url = fmt::format("http://127.0.0.1:{}", client);
  std::string peer_url = fmt::format("http://127.0.0.1:{}", peer);
  // The log lives outside the data directory, or etcd complains about it.
  std::string data = (dir_.path() / fmt::format("data{}", client)).string();
  std::string log = (dir_.path() / "etcd.log").string();
  auto child = std::make_unique<Child>(
      std::vector<std::string>{
          etcd,
          "--name=s1",
          "--data-dir=" + data,
          "--listen-client-urls=" + client_url,
          "--advertise-client-urls=" + client_url,
          "--listen-peer-urls=" + peer_url,
          "--initial-advertise-peer-urls=" + peer_url,
          "--initial-cluster=s1=" + peer_url,
          "--initial-cluster-state=new",
          "--logger=zap",
          "--log-outputs=" + log,
      },
      ChildOptions{
          .stderr_path = (dir_.path() / "etcd.stderr").string(),
          .stop_grace_ns = kStopGraceNs,
          .name = "etcd",
      });
  int64_t deadline = deadline_after(timeout_s);
  for (;;) {
    throw_if_interrupted();
    if (healthy(client)) {
      return child;
    }
    if (!child->running()) {
      if (log_tail().find("address already in use") != std::string::npos) {
        return nullptr;
      }
      throw std::runtime_error(fmt::format(
          "etcd exited at start ({}); its log ends: {}",
          describe_status(child->status()),
          log_tail()));
    }
    if (mono_ns() > deadline) {
      throw std::runtime_error(fmt::format(
          "etcd was not healthy within {} s; its log ends: {}",
          timeout_s,
          log_tail()));
    }
    std::this_thread::sleep_for(kHealthPoll);
  }
}

std::string EtcdServer::log_tail() const {
  std::string text;
  for (const char* name : {"etcd.log", "etcd.stderr"}) {
    std::ifstream f(dir_.path() / name);
    text.append(std::istreambuf_iterator<char>(f), {});
  }
  constexpr size_t kTail = 600;
  return text.size() > kTail ? text.substr(text.size() - kTail) : text;
}

}  // namespace tide::bench
