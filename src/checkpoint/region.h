#pragma once

#include <cstdint>
#include <string>

#include "tide/common/fd.h"

// Checkpoints held in memory by a node's agent (docs/checkpoints.md): one
// file in /dev/shm that the agent creates and reserves when its run begins
// and removes when it ends, which its workers map by name (the variable
// TIDE_CHECKPOINT_REGION) to save their state into and load it back from,
// so that a snapshot outlives the worker that saved it.
//
// The layout, little-endian (python/tide/checkpoint.py writes and reads the
// same bytes):
//
//   [0, 4096)  the region's header: "TIDECKPR", u32 version (2), u32 slots,
//              u64 slot bytes, u64 region bytes, u32 own slots per local
//              rank, u32 the first replica slot, u32 peer (1 while an agent
//              of another node takes this node's snapshots: a save then
//              waits until its rank's newest is there before writing over
//              an older one)
//   then `slots` slots of `slot bytes` each: first each local rank's own
//   (r * own .. r * own + own - 1), written in turn so that one always
//   holds the rank's last complete snapshot; then, with a peer, two per
//   local rank of the peer node, where its agent's copies land:
//     [0, 64)     the slot's header: "TIDECKPS", u32 version (1), u32 state
//                 (0 empty, 1 being written, 2 complete), u64 seq, i64
//                 step, i64 global rank, u64 meta bytes, u64 data bytes,
//                 u64 flags (1: the peer holds it; 2: it came from another
//                 node)
//     [4096, ...) the meta (the state dict's structure and its tensors'
//                 dtypes and shapes), then each tensor's bytes from a
//                 64-byte boundary
//
// A writer marks its slot "being written" before its first byte and
// "complete" after its last, so a worker killed mid-save leaves that slot
// ignored and its previous snapshot in force. An own slot is two per rank,
// three with a peer (docs/checkpoints.md says why three).
namespace tide::checkpoint {

inline constexpr uint64_t kHeaderBytes = 4096;      // the region's, a slot's
inline constexpr uint64_t kMinSlotBytes = 1 << 20;  // room to be useful
inline constexpr const char* kRegionPrefix = "tide-checkpoint-";

inline constexpr uint32_t kRegionVersion = 2;

// A slot's header, as read from the region.
inline constexpr uint32_t kEmpty = 0;
inline constexpr uint32_t kWriting = 1;
inline constexpr uint32_t kComplete = 2;
inline constexpr uint64_t kReplicated = 1;  // flags
inline constexpr uint64_t kFromPeer = 2;

struct Layout {
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;  // each, its header included; a page multiple
  uint64_t bytes = 0;       // the region's
  uint32_t local_ranks = 0;
  uint32_t own = 2;            // own slots per local rank
  uint32_t replicas_from = 0;  // the first replica slot (== slots: none)
};

// How `bytes` is shared by `local_ranks` ranks: two slots each, or with
// `peer` three of their own and two for the peer node's copy of each.
// Throws InvalidArgument when a slot would be under kMinSlotBytes.
Layout plan(uint64_t bytes, int local_ranks, bool peer = false);

struct SlotHead {
  uint32_t state = kEmpty;
  uint64_t seq = 0;
  int64_t step = 0;
  int64_t rank = 0;
  uint64_t meta_bytes = 0;
  uint64_t data_bytes = 0;
  uint64_t flags = 0;

  // The bytes after the header: the meta, aligned, then the data.
  uint64_t payload() const {
    return ((meta_bytes + 63) / 64 * 64) + data_bytes;
  }
};

// A region: one this process made (its file is removed when it is
// destroyed), or one it opened by name (a worker's).
class Region {
 public:
  // Creates `dir`/tide-checkpoint-<pid>-<random>, reserved in full at once
  // (posix_fallocate), so that a worker never meets a full /dev/shm (a
  // SIGBUS) later. Throws Error, with the numbers, when `dir` has no room
  // for it.
  Region(
      const std::string& dir,
      uint64_t bytes,
      int local_ranks,
      bool peer = false);
  // Opens the region at `path` (made by an agent). Throws Error when it is
  // not a region of this version.
  explicit Region(const std::string& path);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::string& path() const {
    return path_;
  }
  const Layout& layout() const {
    return layout_;
  }

  // Slot i in this process's mapping of the region.
  char* slot(uint32_t i);
  // A slot's header; a torn or foreign one reads as empty.
  SlotHead head(uint32_t i);
  // Marks slot i being written and sets its header (its state last).
  void begin(uint32_t i, const SlotHead& h);
  void set_state(uint32_t i, uint32_t state);
  void set_flags(uint32_t i, uint64_t flags);
  // The header's peer field (saves wait for the peer while it is 1).
  bool peer();
  void set_peer(bool on);
  // Copies n bytes between `at` in slot i's snapshot (past its header) and
  // memory of this process, through the file rather than the mapping: the
  // agent never maps the pages of the snapshots it sends and receives (a
  // fault per page costs more than the copy). Throws Error on a short copy.
  void read(uint32_t i, uint64_t at, char* to, uint64_t n) const;
  void write(uint32_t i, uint64_t at, const char* from, uint64_t n);

 private:
  uint64_t offset(uint32_t i, uint64_t at, uint64_t n) const;
  void map();

  std::string path_;
  Layout layout_;
  Fd fd_;
  char* map_ = nullptr;
  bool owner_ = true;
};

// Removes the regions in `dir` of agents that are gone (a crashed agent
// cannot remove its own); returns how many.
int remove_stale(const std::string& dir);

}  // namespace tide::checkpoint
