#pragma once

// Checkpoints held in memory by the node's tide agent, for libtorch
// programs: the C++ twin of Python's tide.checkpoint (docs/checkpoints.md).
// Under `tiderun --checkpoint-memory SIZE` the agent keeps a region of
// /dev/shm across its workers' restarts; a worker saves its state into it,
// byte for byte, and a restarted worker loads it back from memory (or from
// the copy a peer node's agent fetched for it) in place of a disk read:
//
//   tide::checkpoint::State state;
//   for (const auto& p : model->named_parameters()) {
//     state.insert(p.key(), p.value());
//   }
//   auto loaded = tide::checkpoint::load(&state);  // in place
//   int64_t start = loaded.step ? *loaded.step + 1 : 0;
//   for (int64_t step = start; step < steps; ++step) {
//     train_step();
//     tide::checkpoint::save(state, step);
//   }
//
// A state here is named tensors, in order; Python reads what C++ saves as a
// dict of them, and C++ reads what Python saves when it is a dict of
// tensors with string keys (tide.checkpoint writes those in the same
// language-neutral form). Unlike Python's load, this one is not collective:
// it loads this rank's newest snapshot, or the step it is given (a program
// agrees on one with its own collective, as Python's load does with
// all_gather_object).
#include <cstdint>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include "tide/common/error.h"

namespace tide::checkpoint {

// A snapshot that cannot be saved or loaded; says why.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

using State = torch::OrderedDict<std::string, at::Tensor>;

// Whether this worker has its node's checkpoint memory to save into
// (TIDE_CHECKPOINT_REGION is set).
bool available();

// Copies `state` into this rank's next slot as the snapshot of `step` and
// returns once the copy is in; the rank's previous snapshot stays in force
// until this one is complete. Dense tensors of any dtype and device (a
// non-CPU or non-contiguous one goes through a contiguous CPU copy).
// Throws CheckpointError when the state does not fit in a slot, holds a
// sparse or quantized tensor, or the step is negative (the previous
// snapshot is kept), or outside tiderun --checkpoint-memory.
void save(const State& state, int64_t step);

struct Loaded {
  State state;                  // empty when nothing was loaded
  std::optional<int64_t> step;  // nullopt: no snapshot of this rank
  std::string source;           // "memory", "peer" or "none"
};

// This rank's newest complete snapshot (or the one of `step`). With `into`,
// each tensor is copied in place into the tensor of the same name, which
// must have the saved shape and dtype, and `state` holds those; tensors it
// lacks are added new. Without it, the tensors are new, on the devices they
// were saved from. Throws CheckpointError for a snapshot saved from Python
// with values other than tensors, a step this rank does not hold, or a
// tensor of another shape or dtype.
Loaded load(State* into = nullptr, std::optional<int64_t> step = std::nullopt);

}  // namespace tide::checkpoint
