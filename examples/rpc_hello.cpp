// The smallest rpc program: no libtorch, typed values only. Rank 0
// ("driver") asks every other rank ("worker<r>") to add two numbers and
// greet it, then everyone shuts down together.
//
//   tiderun --standalone --nproc-per-node=3 --no-python
//   build/examples/rpc_hello
//
// It links tide_rpc alone: no agent, launcher, etcd, civetweb,
// prometheus-cpp or libcurl (the test suite reads its dynamic section).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tide/rpc/rpc.h"

namespace {

namespace rpc = tide::rpc;

int64_t add(int64_t a, int64_t b) {
  return a + b;
}

std::string greet(std::string who) {
  return "hello " + who + " from " + rpc::get_worker_info().name;
}

TIDE_RPC_FUNCTION(add, &add);
TIDE_RPC_FUNCTION(greet, &greet);

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(stderr, "%s is not set; run me under tiderun\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

}  // namespace

int main() {
  int rank = env_int("RANK");
  int world = env_int("WORLD_SIZE");
  rpc::init_rpc(
      rank == 0 ? "driver" : "worker" + std::to_string(rank), rank, world);
  int failures = 0;
  if (rank == 0) {
    for (int r = 1; r < world; ++r) {
      std::string to = "worker" + std::to_string(r);
      auto sum = rpc::rpc_sync<int64_t>(to, "add", int64_t{r}, int64_t{40});
      auto hi = rpc::rpc_sync<std::string>(to, "greet", std::string("driver"));
      std::printf(
          "%s: add(%d, 40) = %lld; %s\n",
          to.c_str(),
          r,
          static_cast<long long>(sum),
          hi.c_str());
      failures += sum == r + 40 ? 0 : 1;
    }
  }
  rpc::shutdown();  // waits until every worker is done
  return failures == 0 ? 0 : 1;
}
