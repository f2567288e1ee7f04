#pragma once

#include <cstdint>
#include <string>

// Checkpoints held in memory by a node's agent (docs/checkpoints.md): one
// file in /dev/shm that the agent creates and reserves when its run begins
// and removes when it ends, which its workers map by name (the variable
// TIDE_CHECKPOINT_REGION) to save their state into and load it back from,
// so that a snapshot outlives the worker that saved it.
//
// The layout, little-endian (python/tide/checkpoint.py writes and reads the
// same bytes):
//
//   [0, 4096)  the region's header: "TIDECKPR", u32 version (1), u32 slots,
//              u64 slot bytes, u64 region bytes
//   then `slots` slots of `slot bytes` each, two per local rank (2r, 2r+1),
//   written in turn so that one always holds the rank's last complete
//   snapshot:
//     [0, 64)     the slot's header: "TIDECKPS", u32 version (1), u32 state
//                 (0 empty, 1 being written, 2 complete), u64 seq, i64
//                 step, i64 global rank, u64 meta bytes, u64 data bytes,
//                 u64 0
//     [4096, ...) the meta (the state dict's structure and its tensors'
//                 dtypes and shapes), then each tensor's bytes from a
//                 64-byte boundary
//
// A writer marks its slot "being written" before its first byte and
// "complete" after its last, so a worker killed mid-save leaves that slot
// ignored and the other one (its previous snapshot) in force.
namespace tide::checkpoint {

inline constexpr uint64_t kHeaderBytes = 4096;      // the region's, a slot's
inline constexpr uint64_t kMinSlotBytes = 1 << 20;  // room to be useful
inline constexpr const char* kRegionPrefix = "tide-checkpoint-";

struct Layout {
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;  // each, its header included; a page multiple
  uint64_t bytes = 0;       // the region's
};

// How `bytes` is shared by `local_ranks` ranks, two slots each. Throws
// InvalidArgument when a slot would be under kMinSlotBytes.
Layout plan(uint64_t bytes, int local_ranks);

// A region this process made; its file is removed when it is destroyed.
class Region {
 public:
  // Creates `dir`/tide-checkpoint-<pid>-<random>, reserved in full at once
  // (posix_fallocate), so that a worker never meets a full /dev/shm (a
  // SIGBUS) later. Throws Error, with the numbers, when `dir` has no room
  // for it.
  Region(const std::string& dir, uint64_t bytes, int local_ranks);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::string& path() const {
    return path_;
  }
  const Layout& layout() const {
    return layout_;
  }

 private:
  std::string path_;
  Layout layout_;
};

// Removes the regions in `dir` of agents that are gone (a crashed agent
// cannot remove its own); returns how many.
int remove_stale(const std::string& dir);

}  // namespace tide::checkpoint
