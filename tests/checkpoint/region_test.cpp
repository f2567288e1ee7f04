// The checkpoint region (src/checkpoint/region.h): how a bound is shared,
// the file and its header, its removal, and stale regions.
#include "checkpoint/region.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "support/temp_dir.h"

namespace tide::checkpoint {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointRegionTest, ABoundIsSharedAsTwoPageAlignedSlotsPerRank) {
  Layout l = plan(64 << 20, 2);
  EXPECT_EQ(l.slots, 4u);
  EXPECT_EQ(l.slot_bytes % 4096, 0u);
  EXPECT_EQ(l.slot_bytes, ((64u << 20) - kHeaderBytes) / 4 / 4096 * 4096);
  EXPECT_LE(l.bytes, 64u << 20);
  EXPECT_EQ(l.bytes, kHeaderBytes + 4 * l.slot_bytes);

  try {
    plan(3 << 20, 2);
    FAIL() << "3 MiB for 2 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("3.0 MiB is too small for 2 local ranks"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(plan(64 << 20, 0), InvalidArgument);
}

TEST(CheckpointRegionTest, WithAPeerEachRankHasThreeSlotsAndTwoForThePeers) {
  Layout l = plan(64 << 20, 2, /*peer=*/true);
  EXPECT_EQ(l.slots, 10u);
  EXPECT_EQ(l.own, 3u);
  EXPECT_EQ(l.replicas_from, 6u);
  EXPECT_EQ(l.local_ranks, 2u);
  EXPECT_EQ(l.slot_bytes, ((64u << 20) - kHeaderBytes) / 10 / 4096 * 4096);
  try {
    plan(8 << 20, 2, true);
    FAIL() << "8 MiB for 2 ranks and their copies";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "each needs five slots (three of its own, two for a peer node's "
            "copy)"),
        std::string::npos)
        << e.what();
  }
}

TEST(CheckpointRegionTest, SlotHeadersAreReadAsWrittenAndATornOneIsEmpty) {
  test::TempDir dir;
  Region r(dir.path().string(), 8 << 20, 1, true);
  EXPECT_EQ(r.head(0).state, kEmpty);
  SlotHead h{
      .seq = 7, .step = 41, .rank = 3, .meta_bytes = 100, .data_bytes = 4096};
  r.begin(1, h);
  EXPECT_EQ(r.head(1).state, kWriting);
  r.set_state(1, kComplete);
  r.set_flags(1, kReplicated);
  SlotHead got = r.head(1);
  EXPECT_EQ(got.state, kComplete);
  EXPECT_EQ(got.seq, 7u);
  EXPECT_EQ(got.step, 41);
  EXPECT_EQ(got.rank, 3);
  EXPECT_EQ(got.payload(), 128u + 4096u);
  EXPECT_EQ(got.flags, kReplicated);
  // Bytes go in and out through the file, and land where the mapping
  // (the workers') sees them; never past the slot.
  r.write(1, 10, "snapshot", 8);
  EXPECT_EQ(std::string(r.slot(1) + kHeaderBytes + 10, 8), "snapshot");
  char back[8];
  r.read(1, 10, back, 8);
  EXPECT_EQ(std::string(back, 8), "snapshot");
  const uint64_t room = r.layout().slot_bytes - kHeaderBytes;
  EXPECT_THROW(r.write(1, room - 4, "snapshot", 8), InvalidArgument);
  EXPECT_THROW(r.read(r.layout().slots, 0, back, 1), InvalidArgument);
  // Sizes past the slot (a torn header, or not ours) are never trusted.
  r.begin(2, SlotHead{.seq = 1, .data_bytes = r.layout().slot_bytes});
  r.set_state(2, kComplete);
  EXPECT_EQ(r.head(2).state, kEmpty);
}

TEST(CheckpointRegionTest, AWorkerOpensItByNameAndLeavesTheFile) {
  test::TempDir dir;
  Region made(dir.path().string(), 64 << 20, 2, true);
  {
    Region opened(made.path());
    EXPECT_EQ(opened.layout().slots, made.layout().slots);
    EXPECT_EQ(opened.layout().slot_bytes, made.layout().slot_bytes);
    EXPECT_EQ(opened.layout().own, 3u);
    EXPECT_EQ(opened.layout().replicas_from, 6u);
    EXPECT_EQ(opened.layout().local_ranks, 2u);
    made.set_peer(true);
    EXPECT_TRUE(opened.peer());
    opened.begin(0, SlotHead{.seq = 1, .step = 2, .rank = 0, .meta_bytes = 8});
    opened.set_state(0, kComplete);
    EXPECT_EQ(made.head(0).step, 2);
  }
  EXPECT_TRUE(fs::exists(made.path())) << "the agent's to remove";
  std::string other = (dir.path() / "not-a-region").string();
  std::ofstream(other) << std::string(8192, 'x');
  EXPECT_THROW(Region{other}, Error);
  EXPECT_THROW(Region{(dir.path() / "missing").string()}, Error);
}

TEST(CheckpointRegionTest, TheFileHoldsItsHeaderAndGoesWithTheRegion) {
  test::TempDir dir;
  std::string path;
  {
    Region r(dir.path().string(), 8 << 20, 1);
    path = r.path();
    ASSERT_TRUE(fs::exists(path));
    EXPECT_EQ(fs::file_size(path), r.layout().bytes);
    EXPECT_EQ(
        fs::path(path).filename().string().rfind(
            "tide-checkpoint-" + std::to_string(::getpid()) + "-", 0),
        0u);
    std::ifstream in(path, std::ios::binary);
    char header[48];
    in.read(header, sizeof header);
    EXPECT_EQ(std::string(header, 8), "TIDECKPR");
    uint32_t version = 0;
    uint32_t slots = 0;
    uint64_t slot_bytes = 0;
    std::memcpy(&version, header + 8, 4);
    std::memcpy(&slots, header + 12, 4);
    std::memcpy(&slot_bytes, header + 16, 8);
    uint32_t own = 0;
    uint32_t replicas_from = 0;
    uint32_t peer = 1;
    std::memcpy(&own, header + 32, 4);
    std::memcpy(&replicas_from, header + 36, 4);
    std::memcpy(&peer, header + 40, 4);
    EXPECT_EQ(version, 2u);
    EXPECT_EQ(slots, 2u);
    EXPECT_EQ(slot_bytes, r.layout().slot_bytes);
    EXPECT_EQ(own, 2u);
    EXPECT_EQ(replicas_from, 2u);
    EXPECT_EQ(peer, 0u);
  }
  EXPECT_FALSE(fs::exists(path)) << "removed with the region";
}

TEST(CheckpointRegionTest, StaleRegionsOfDeadAgentsAreRemovedOthersKept) {
  test::TempDir dir;
  pid_t dead = ::fork();
  if (dead == 0) {
    ::_exit(0);
  }
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  auto touch = [&](const std::string& name) {
    std::ofstream(dir.path() / name) << "x";
  };
  touch("tide-checkpoint-" + std::to_string(dead) + "-aaaa");
  touch("tide-checkpoint-" + std::to_string(::getpid()) + "-bbbb");
  touch("other-file");
  EXPECT_EQ(remove_stale(dir.path().string()), 1);
  EXPECT_FALSE(fs::exists(
      dir.path() / ("tide-checkpoint-" + std::to_string(dead) + "-aaaa")));
  EXPECT_TRUE(fs::exists(
      dir.path() /
      ("tide-checkpoint-" + std::to_string(::getpid()) + "-bbbb")));
  EXPECT_TRUE(fs::exists(dir.path() / "other-file"));
}

TEST(CheckpointRegionTest, ADirectoryThatCannotHoldItIsAClearError) {
  try {
    Region r("/nonexistent-dir", 8 << 20, 1);
    FAIL() << "no such directory";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("cannot create the checkpoint memory"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tide::checkpoint
