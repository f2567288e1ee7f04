// A worker program for tiderun: it reads torchrun's environment, joins the
// store its agent shares (MASTER_ADDR:MASTER_PORT, under
// /worker/attempt_<restart count> as torch's workers do), counts in, waits
// for everyone and has rank 0 report.
//
//   tiderun --standalone --nproc-per-node=4 --max-restarts=1 store_worker
//   [--fail-once]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tide/common/error.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(
        stderr, "store_worker: %s is not set; run me under tiderun\n", name);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  bool fail_once = argc > 1 && std::strcmp(argv[1], "--fail-once") == 0;
  int rank = std::stoi(env("RANK"));
  int world = std::stoi(env("WORLD_SIZE"));
  std::string attempt = env("TORCHELASTIC_RESTART_COUNT");
  if (fail_once && attempt == "0" && rank == world - 1) {
    std::fprintf(stderr, "rank %d: crashing on purpose in attempt 0\n", rank);
    return 1;
  }
  try {
    auto agent_store =
        std::make_shared<tide::store::TcpStore>(tide::store::TcpStoreOptions{
            .host = env("MASTER_ADDR"),
            .port = static_cast<uint16_t>(std::stoi(env("MASTER_PORT"))),
            .timeout = 60s});
    tide::store::PrefixStore store("/worker/attempt_" + attempt, agent_store);
    store.add("arrived", 1);
    store.set(
        "hello/" + std::to_string(rank), "pid " + std::to_string(::getpid()));
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) {
      keys.push_back("hello/" + std::to_string(r));
    }
    auto hellos = store.multi_get(keys);
    if (rank == 0) {
      std::printf(
          "rank 0: all %d workers checked in on attempt %s (%s ... %s)\n",
          world,
          attempt.c_str(),
          hellos.front().c_str(),
          hellos.back().c_str());
    }
  } catch (const tide::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
