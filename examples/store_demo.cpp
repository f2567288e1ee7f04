// A tour of tide's store: four "workers" (threads here, processes or hosts
// in real jobs) meet at a TCP store, count themselves in, publish their
// addresses and read everyone's -- the pattern a rendezvous round follows.
//
//   store_demo HOST PORT      (a running tide-store, or torch's TCPStore)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tide/common/error.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  using tide::store::TcpStore;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  const std::string host = argv[1];
  const auto port = static_cast<uint16_t>(std::atoi(argv[2]));
  constexpr int kWorkers = 4;

  try {
    std::vector<std::jthread> workers;
    for (int i = 0; i < kWorkers; ++i) {
      workers.emplace_back([&] {
        auto client = std::make_shared<TcpStore>(tide::store::TcpStoreOptions{
            .host = host, .port = port, .timeout = 30s});
        tide::store::PrefixStore round("demo/round_0", client);
        // Everyone counts in; the count is the rank (0-based).
        int64_t rank = round.add("arrived", 1) - 1;
        round.set(
            "addr_" + std::to_string(rank),
            "worker" + std::to_string(rank) + ":1234");
        std::vector<std::string> keys;
        for (int r = 0; r < kWorkers; ++r) {
          keys.push_back("addr_" + std::to_string(r));
        }
        auto addrs = round.multi_get(keys);  // waits for all of them
        std::string line = "rank " + std::to_string(rank) + " sees:";
        for (const auto& a : addrs) {
          line += " " + a;
        }
        std::printf("%s\n", line.c_str());
      });
    }
  } catch (const tide::Error& e) {
    std::fprintf(stderr, "store_demo: %s\n", e.what());
    return 1;
  }
  TcpStore store({.host = host, .port = port, .timeout = 30s});
  store.set("demo/greeting", "hello from tide");
  std::printf(
      "keys in the store: %lld\n", static_cast<long long>(store.num_keys()));
  return 0;
}
