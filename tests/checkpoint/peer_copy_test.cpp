// The copy of a node's snapshots on another node (src/checkpoint/peer_copy.h)
// with real regions and real sockets on 127.0.0.1: a snapshot saved on one
// node lands, byte for byte, in the replica slots of its peer; a new node
// fetches the snapshots of its ranks from the node that holds them; bad
// chunks are refused without harm to what is held; a copy cut short is
// never complete; an agent without the job's secret gets nothing.
#include "checkpoint/peer_copy.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "checkpoint/region.h"
#include "support/eventually.h"
#include "support/temp_dir.h"
#include "transport/fields.h"
#include "transport/transport.h"

namespace tide::checkpoint {
namespace {

constexpr const char* kToken = "the job's secret";
// Small chunks: a snapshot of a few MiB is many of them, past the window.
constexpr uint64_t kChunkBytes = 256 << 10;

// Fills slot i with a complete snapshot whose bytes follow from `seed`.
void save(Region& r, uint32_t i, const SlotHead& h, char seed) {
  ASSERT_LE(kHeaderBytes + h.payload(), r.layout().slot_bytes);
  r.begin(i, h);
  char* at = r.slot(i) + kHeaderBytes;
  for (uint64_t b = 0; b < h.payload(); ++b) {
    at[b] = static_cast<char>(seed + b * 31);
  }
  r.set_state(i, kComplete);
}

bool same_bytes(Region& a, uint32_t i, Region& b, uint32_t j) {
  SlotHead h = a.head(i);
  return std::memcmp(
             a.slot(i) + kHeaderBytes, b.slot(j) + kHeaderBytes, h.payload()) ==
         0;
}

PeerNode node(int rank, const PeerCopy& p) {
  return PeerNode{
      .rank = rank, .id = p.id(), .host = "127.0.0.1", .port = p.port()};
}

PeerCopyOptions options(std::string token = kToken) {
  return PeerCopyOptions{
      .listen_host = "127.0.0.1",
      .token = std::move(token),
      .chunk_bytes = kChunkBytes,
      .timeout = std::chrono::seconds(10)};
}

// Two nodes' regions (two local ranks each: 64 MiB is five slots of about
// 12.8 MiB per rank).
struct TwoRegions {
  test::TempDir dir;
  Region a{dir.path().string(), 64 << 20, 2, true};
  Region b{dir.path().string(), 64 << 20, 2, true};
};

TEST(PeerCopyTest, ANodesNewestSnapshotsLandInItsPeersReplicaSlots) {
  TwoRegions regions;
  Region& a = regions.a;
  Region& b = regions.b;
  // Local rank 1 of node 0 (global rank 1): an older and a newer snapshot,
  // the newer over many chunks, before the round begins.
  const uint32_t own1 = a.layout().own;
  save(
      a,
      own1,
      SlotHead{
          .seq = 1,
          .step = 4,
          .rank = 1,
          .meta_bytes = 200,
          .data_bytes = 1000},
      1);
  save(
      a,
      own1 + 1,
      SlotHead{
          .seq = 2,
          .step = 5,
          .rank = 1,
          .meta_bytes = 300,
          .data_bytes = 25 * kChunkBytes / 2},
      2);
  PeerCopy pa(a, options());
  PeerCopy pb(b, options());
  std::vector<PeerNode> nodes = {node(0, pa), node(1, pb)};
  pa.set_round(0, nodes, 1);
  pb.set_round(1, nodes, 0);
  ASSERT_TRUE(test::eventually(
      [&] { return (a.head(own1 + 1).flags & kReplicated) != 0; }));
  EXPECT_EQ(a.head(own1).flags & kReplicated, 0u) << "only the newest goes";

  uint32_t found = 0;
  for (uint32_t s = b.layout().replicas_from; s < b.layout().slots; ++s) {
    SlotHead h = b.head(s);
    if (h.state == kComplete) {
      ++found;
      EXPECT_EQ(s, b.layout().replicas_from + 2) << "local rank 1's first";
      EXPECT_EQ(h.step, 5);
      EXPECT_EQ(h.rank, 1);
      EXPECT_EQ(h.seq, 2u);
      EXPECT_TRUE(same_bytes(a, own1 + 1, b, s));
    }
  }
  EXPECT_EQ(found, 1u);
  EXPECT_EQ(pa.stats().copies, 1u);

  // The next snapshot goes to the other replica slot; the one before stays
  // whole meanwhile.
  save(
      a,
      own1 + 2,
      SlotHead{
          .seq = 3, .step = 6, .rank = 1, .meta_bytes = 10, .data_bytes = 5000},
      3);
  ASSERT_TRUE(test::eventually(
      [&] { return (a.head(own1 + 2).flags & kReplicated) != 0; }));
  SlotHead newer = b.head(b.layout().replicas_from + 3);
  EXPECT_EQ(newer.step, 6);
  EXPECT_TRUE(same_bytes(a, own1 + 2, b, b.layout().replicas_from + 3));
  EXPECT_EQ(b.head(b.layout().replicas_from + 2).step, 5);
}

TEST(PeerCopyTest, ANewNodeFetchesItsRanksFromTheNodeThatHoldsThem) {
  TwoRegions regions;
  Region& a = regions.a;
  Region& b = regions.b;
  // b holds node 0's copies of rank 2 (two steps) and its own rank 0.
  const uint32_t r = b.layout().replicas_from;
  save(
      b,
      r,
      SlotHead{
          .seq = 4,
          .step = 8,
          .rank = 2,
          .meta_bytes = 64,
          .data_bytes = 20 * kChunkBytes + 5},
      7);
  save(
      b,
      r + 1,
      SlotHead{
          .seq = 5, .step = 9, .rank = 2, .meta_bytes = 64, .data_bytes = 100},
      8);
  save(
      b,
      0,
      SlotHead{
          .seq = 1, .step = 9, .rank = 0, .meta_bytes = 64, .data_bytes = 100},
      9);
  PeerCopy pb(b, options());
  PeerCopy pa(a, options());  // the new node, empty
  std::vector<PeerNode> nodes = {node(0, pb), node(1, pa)};
  pb.set_round(0, nodes, -1);
  pa.set_round(1, nodes, 0);  // b takes a's copies

  // Rank 2 runs as a's local rank 1; rank 3 is nowhere.
  FetchResult fetched = pa.fetch({{2, 1}, {3, 0}});
  EXPECT_EQ(fetched.error, "");
  const std::vector<Fetched>& got = fetched.got;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rank, 2);
  EXPECT_EQ(got[0].from, 0);
  EXPECT_EQ(got[0].steps, (std::vector<int64_t>{9, 8}));
  const uint32_t own1 = a.layout().own;
  EXPECT_EQ(a.head(own1).step, 9);
  // Fetched from its peer, which holds it: not copied back there.
  EXPECT_EQ(a.head(own1).flags, kFromPeer | kReplicated);
  EXPECT_EQ(pa.stats().copies, 0u);
  EXPECT_TRUE(same_bytes(b, r + 1, a, own1));
  EXPECT_EQ(a.head(own1 + 1).step, 8);
  EXPECT_TRUE(same_bytes(b, r, a, own1 + 1));
  for (uint32_t s = 0; s < own1; ++s) {
    EXPECT_EQ(a.head(s).state, kEmpty) << "local rank 0 asked for rank 3";
  }
}

TEST(PeerCopyTest, AnAgentWithoutTheSecretGetsNothing) {
  TwoRegions regions;
  Region& a = regions.a;
  Region& b = regions.b;
  save(
      b,
      0,
      SlotHead{
          .seq = 1, .step = 9, .rank = 0, .meta_bytes = 64, .data_bytes = 100},
      9);
  PeerCopy pb(b, options());
  PeerCopy pa(a, options("another secret"));
  std::vector<PeerNode> nodes = {node(0, pb), node(1, pa)};
  pb.set_round(0, nodes, -1);
  pa.set_round(1, nodes, -1);
  FetchResult r = pa.fetch({{0, 0}});
  EXPECT_TRUE(r.got.empty());
  EXPECT_NE(r.error.find("token"), std::string::npos) << r.error;
  for (uint32_t s = 0; s < a.layout().slots; ++s) {
    EXPECT_EQ(a.head(s).state, kEmpty);
  }
}

// Puts a peer's copy of rank 0's step 3 in b's first replica slot; returns
// that slot.
uint32_t hold_a_copy(Region& b) {
  const uint32_t r = b.layout().replicas_from;
  save(
      b,
      r,
      SlotHead{
          .seq = 1, .step = 3, .rank = 0, .meta_bytes = 64, .data_bytes = 100},
      5);
  return r;
}

// A client speaking the peer copy's messages by hand.
class RawPeer {
 public:
  explicit RawPeer(const PeerCopy& to) {
    transport::TransportOptions o;
    o.self_id = 7;
    o.self_name = "checkpoint-7";
    o.shared_memory = false;
    o.token = kToken;
    o.message_types = transport::MessageTypes{
        {0x10, "PUT"}, {0x11, "ACK"}, {0x12, "FETCH"}, {0x13, "FETCHED"}};
    t_ = std::make_unique<transport::Transport>(
        std::move(o),
        transport::TransportHandlers{
            .on_message =
                [this](const transport::Pipe&, transport::Message m) {
                  transport::FieldReader r(m.metadata, "ACK");
                  std::lock_guard lock(mutex_);
                  acks_.push_back(r.str());
                  changed_.notify_all();
                },
            .on_closed = [](const transport::Pipe&, const std::string&) {}});
    t_->set_peers({transport::PeerAddress{
        .id = to.id(),
        .name = "checkpoint-" + std::to_string(to.id()),
        .host = "127.0.0.1",
        .port = to.port()}});
    pipe_ = t_->pipe_to(to.id());
  }

  // A chunk of a copy (purpose 0) of rank `rank`'s step from local rank
  // `local`; place 0: more, 1: last.
  void put(
      uint64_t id,
      const SlotHead& h,
      uint32_t local,
      uint64_t offset,
      uint32_t place,
      std::string bytes) {
    transport::Message m{
        .type = 0x10,
        .id = id,
        .metadata = transport::FieldWriter()
                        .u32(0)
                        .u64(0)
                        .u64(h.seq)
                        .i64(h.step)
                        .i64(h.rank)
                        .u64(h.meta_bytes)
                        .u64(h.data_bytes)
                        .u32(local)
                        .u64(offset)
                        .u32(place)
                        .take()};
    m.buffers.emplace_back(std::move(bytes));
    ASSERT_TRUE(pipe_.send(std::move(m)));
  }

  // The next acknowledgement's error ("" for none).
  std::string ack() {
    std::unique_lock lock(mutex_);
    EXPECT_TRUE(changed_.wait_for(
        lock, std::chrono::seconds(10), [&] { return !acks_.empty(); }));
    if (acks_.empty()) {
      return "(no answer)";
    }
    std::string a = acks_.front();
    acks_.erase(acks_.begin());
    return a;
  }

  void close() {
    t_->shutdown();
    t_->join();
  }

 private:
  std::unique_ptr<transport::Transport> t_;
  transport::Pipe pipe_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> acks_;
};

TEST(PeerCopyTest, BadChunksAreRefusedAndWhatIsHeldStays) {
  TwoRegions regions;
  Region& b = regions.b;
  PeerCopy pb(b, options());
  const uint32_t r = hold_a_copy(b);
  std::string before(b.slot(r), kHeaderBytes + 164);
  RawPeer raw(pb);
  const SlotHead good{
      .seq = 2, .step = 4, .rank = 0, .meta_bytes = 64, .data_bytes = 100};

  SlotHead huge = good;
  huge.data_bytes = b.layout().slot_bytes;
  raw.put(1, huge, 0, 0, 1, std::string(16, 'x'));
  EXPECT_NE(raw.ack().find("over this node's slots"), std::string::npos);

  raw.put(2, good, 5, 0, 1, std::string(164, 'x'));
  EXPECT_NE(raw.ack().find("no copy for local rank 5"), std::string::npos);

  raw.put(3, good, 0, 64, 1, std::string(100, 'x'));
  EXPECT_NE(raw.ack().find("out of order"), std::string::npos);

  raw.put(4, good, 0, 0, 0, std::string(100, 'x'));
  EXPECT_EQ(raw.ack(), "");
  raw.put(4, good, 0, 100, 1, std::string(100, 'x'));  // 36 bytes too many
  EXPECT_NE(raw.ack().find("past its snapshot's end"), std::string::npos);

  raw.put(5, good, 0, 0, 1, std::string(100, 'x'));  // 64 bytes short
  EXPECT_NE(raw.ack().find("ended short"), std::string::npos);

  EXPECT_EQ(std::string(b.slot(r), kHeaderBytes + 164), before)
      << "the copy held is untouched";
  for (uint32_t s = 0; s < b.layout().slots; ++s) {
    if (s != r) {
      EXPECT_NE(b.head(s).state, kComplete) << s;
    }
  }

  // And a good one still lands.
  raw.put(6, good, 0, 0, 1, std::string(164, 'g'));
  EXPECT_EQ(raw.ack(), "");
  EXPECT_EQ(b.head(r + 1).step, 4);
  EXPECT_EQ(b.head(r + 1).state, kComplete);
}

TEST(PeerCopyTest, ACopyCutShortIsNeverComplete) {
  TwoRegions regions;
  Region& b = regions.b;
  PeerCopy pb(b, options());
  const uint32_t r = hold_a_copy(b);
  {
    RawPeer raw(pb);
    const SlotHead h{
        .seq = 2, .step = 4, .rank = 0, .meta_bytes = 64, .data_bytes = 1000};
    raw.put(1, h, 0, 0, 0, std::string(500, 'x'));
    EXPECT_EQ(raw.ack(), "");
    EXPECT_EQ(b.head(r + 1).state, kWriting);
    raw.close();  // the sending node is lost
  }
  ASSERT_TRUE(test::eventually([&] { return b.head(r + 1).state == kEmpty; }));
  EXPECT_EQ(b.head(r).state, kComplete);
  EXPECT_EQ(b.head(r).step, 3);
}

}  // namespace
}  // namespace tide::checkpoint
