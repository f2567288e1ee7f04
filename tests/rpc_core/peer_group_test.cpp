// The rpc group in the store (rpc_core/peer_group.h): entries, meeting,
// and the barrier's rounds, over a store in memory.
#include "rpc_core/peer_group.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::rpc_core {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// A GroupStore in memory: a map, and waits woken by a condition variable.
class MapGroupStore : public GroupStore {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mutex_);
      map_[key] = value;
    }
    cv_.notify_all();
  }
  std::string compare_set(
      const std::string& key,
      const std::string& expected,
      const std::string& desired) override {
    std::string now;
    {
      std::lock_guard lock(mutex_);
      auto it = map_.find(key);
      if (it == map_.end() ? expected.empty() : it->second == expected) {
        map_[key] = desired;
        now = desired;
      } else {
        now = it == map_.end() ? expected : it->second;
      }
    }
    cv_.notify_all();
    return now;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t now = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = map_.find(key);
      now = (it == map_.end() ? 0 : std::stoll(it->second)) + delta;
      map_[key] = std::to_string(now);
    }
    cv_.notify_all();
    return now;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t)
      override {
    std::unique_lock lock(mutex_);
    bool all = cv_.wait_for(lock, t, [&] {
      for (const auto& k : keys) {
        if (!map_.contains(k)) {
          return false;
        }
      }
      return true;
    });
    if (!all) {
      throw TimeoutError(
          "keys missing after " + std::to_string(t.count()) + " ms");
    }
  }
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& k : keys) {
      out.push_back(map_.at(k));
    }
    return out;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;  // Guarded by mutex_.
};

transport::PeerAddress peer(int rank, std::string name) {
  return {rank, std::move(name), "127.0.0.1", uint16_t(4000 + rank), "k", ""};
}

TEST(PeerGroupTest, EntriesRoundTripAndBadOnesThrow) {
  transport::PeerAddress a{
      3, "w:3", "10.0.0.1", 4242, "key", std::string("\0abs", 4)};
  auto b = decode_peer(3, encode_peer(a));
  EXPECT_EQ(b.id, 3);
  EXPECT_EQ(b.name, a.name);
  EXPECT_EQ(b.host, a.host);
  EXPECT_EQ(b.port, a.port);
  EXPECT_EQ(b.host_key, a.host_key);
  EXPECT_EQ(b.local_name, a.local_name);
  EXPECT_THROW(decode_peer(2, encode_peer(a)), ProtocolError);  // not rank 2's
  EXPECT_THROW(decode_peer(0, "nonsense"), ProtocolError);
  EXPECT_THROW(decode_peer(0, ""), ProtocolError);
  std::string longer = encode_peer(a) + "x";
  EXPECT_THROW(decode_peer(3, longer), ProtocolError);
}

TEST(PeerGroupTest, EveryoneMeetsEveryoneByRank) {
  MapGroupStore store;
  std::vector<std::future<std::vector<transport::PeerAddress>>> meeting;
  for (int r = 2; r >= 0; --r) {
    meeting.push_back(std::async(std::launch::async, [&store, r] {
      return meet(store, peer(r, "w" + std::to_string(r)), 3, 10s);
    }));
  }
  for (auto& m : meeting) {
    auto peers = m.get();
    ASSERT_EQ(peers.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(peers[r].id, r);
      EXPECT_EQ(peers[r].name, "w" + std::to_string(r));
      EXPECT_EQ(peers[r].port, 4000 + r);
    }
  }
}

TEST(PeerGroupTest, ANameTakenAWorldSizeDifferentOrARankOutsideIsRefused) {
  MapGroupStore store;
  // Rank 0 waits for rank 1's entry, published by the calls below: long
  // enough for them on a loaded machine (it ends once rank 1 is in).
  auto first = std::async(
      std::launch::async, [&] { return meet(store, peer(0, "a"), 2, 30s); });
  store.wait({peer_key(0)}, 10s);
  try {
    meet(store, peer(1, "a"), 2, 200ms);
    ADD_FAILURE() << "a taken name was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("worker name 'a' is taken by rank 0"));
  }
  try {
    meet(store, peer(1, "b"), 3, 200ms);
    ADD_FAILURE() << "a second world size was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("started with world_size 2"));
  }
  EXPECT_THROW(meet(store, peer(2, "c"), 2, 200ms), InvalidArgument);
  // Rank 1 published its entry all the same: rank 0 finds the duplicate.
  try {
    first.get();
    ADD_FAILURE() << "rank 0 met a group with a name twice";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'a' is not unique: ranks 0 and 1"));
  }
}

TEST(PeerGroupTest, AnIncompleteGroupIsARendezvousError) {
  MapGroupStore store;
  EXPECT_THROW(meet(store, peer(0, "a"), 2, 50ms), RendezvousError);
}

TEST(PeerGroupTest, DrainHoldsEveryoneUntilARoundSumsZero) {
  MapGroupStore store;
  // Worker 0 still has one call in flight at the first count, none later:
  // both go round twice, and worker 1's idle wait runs twice too.
  std::atomic<int> counts0{0}, idles1{0};
  auto zero = std::async(std::launch::async, [&] {
    GroupBarrier b(store, 2);
    b.drain([] {}, [&] { return counts0.fetch_add(1) == 0 ? 1 : 0; }, 10s);
    b.leave(true, 10s);
  });
  auto one = std::async(std::launch::async, [&] {
    GroupBarrier b(store, 2);
    b.drain([&] { idles1.fetch_add(1); }, [] { return 0; }, 10s);
    b.leave(false, 10s);
  });
  zero.get();
  one.get();
  EXPECT_EQ(counts0.load(), 2);
  EXPECT_EQ(idles1.load(), 2);
}

TEST(PeerGroupTest, ARoundNotEveryoneReachesTimesOut) {
  MapGroupStore store;
  GroupBarrier b(store, 2);
  EXPECT_THROW(b.sum(0, 50ms), TimeoutError);
}

}  // namespace
}  // namespace tide::rpc_core
