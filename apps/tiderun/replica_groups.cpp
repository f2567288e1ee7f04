#include "replica_groups.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tide/common/logging.h"
#include "tide/store/tcp_store.h"

extern char** environ;

namespace tiderun {
namespace {

std::vector<pid_t> g_groups;

extern "C" void pass_on(int sig) {
  for (pid_t pid : g_groups) {
    ::kill(pid, sig);
  }
}

}  // namespace

int run_replica_groups(int argc, char** argv, int script_at, int groups) {
  // The quorum's store: here, for as long as any group runs.
  auto server =
      tide::store::TcpStoreServer::start({.host = "127.0.0.1", .port = 0});
  std::string store =
      "127.0.0.1:" + std::to_string(server->port()) + "/default";
  ::unsetenv("PET_REPLICA_GROUPS");
  struct sigaction sa {};
  sa.sa_handler = pass_on;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  TIDE_LOG_INFO(
      "running {} replica groups (ids 0-{}), their quorum in this tiderun's "
      "store at {}",
      groups,
      groups - 1,
      store);
  for (int g = 0; g < groups; ++g) {
    std::vector<std::string> args = {argv[0]};
    for (int i = 1; i < script_at; ++i) {
      std::string_view a = argv[i];
      if (a.starts_with("--replica-groups=") ||
          a.starts_with("--replica_groups=")) {
        continue;
      }
      if (a == "--replica-groups" || a == "--replica_groups") {
        ++i;  // and its value
        continue;
      }
      args.emplace_back(a);
    }
    args.push_back("--ft-store=" + store);
    // Numbers, as TorchFT's scripts read REPLICA_GROUP_ID.
    args.push_back("--replica-group-id=" + std::to_string(g));
    args.push_back("--num-replica-groups=" + std::to_string(groups));
    for (int i = script_at; i < argc; ++i) {
      args.emplace_back(argv[i]);
    }
    std::vector<char*> cargs;
    for (auto& a : args) {
      cargs.push_back(a.data());
    }
    cargs.push_back(nullptr);
    pid_t pid = -1;
    int rc = ::posix_spawn(
        &pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ);
    if (rc != 0) {
      std::fprintf(stderr, "tiderun: cannot start replica group %d\n", g);
      pass_on(SIGTERM);
      break;
    }
    g_groups.push_back(pid);
  }
  int code = g_groups.size() == static_cast<size_t>(groups) ? 0 : 1;
  for (size_t i = 0; i < g_groups.size(); ++i) {
    int status = 0;
    while (::waitpid(g_groups[i], &status, 0) < 0 && errno == EINTR) {
    }
    int c = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (c != 0) {
      TIDE_LOG_WARN("replica group {} ended with {}", i, c);
      code = code == 0 ? c : code;
    }
  }
  return code;
}

}  // namespace tiderun
