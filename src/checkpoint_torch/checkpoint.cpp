#include "tide/checkpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include "tide/common/strings.h"

#include "checkpoint/region.h"

// The same bytes as python/tide/checkpoint.py, for the snapshots whose meta
// is the language-neutral one (JSON, a '{' first); see region.h for the
// region and its slots.
namespace tide::checkpoint {
namespace {

constexpr uint64_t kAlign = 64;

uint64_t align(uint64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// dtype names as Python's tide.checkpoint writes them (str(dtype) less
// "torch.").
const std::vector<std::pair<at::ScalarType, const char*>>& dtypes() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kFloat, "float32"},
      {at::kDouble, "float64"},
      {at::kHalf, "float16"},
      {at::kBFloat16, "bfloat16"},
      {at::kLong, "int64"},
      {at::kInt, "int32"},
      {at::kShort, "int16"},
      {at::kChar, "int8"},
      {at::kByte, "uint8"},
      {at::kBool, "bool"},
      {at::kComplexFloat, "complex64"},
      {at::kComplexDouble, "complex128"},
  };
  return names;
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [type, name] : dtypes()) {
    if (type == t) {
      return name;
    }
  }
  throw CheckpointError(
      std::string("save: tensors of dtype ") + c10::toString(t) +
      " are not supported");
}

at::ScalarType dtype_of(const std::string& name) {
  for (const auto& [type, n] : dtypes()) {
    if (name == n) {
      return type;
    }
  }
  throw CheckpointError("load: a tensor of dtype " + name + " (unknown here)");
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    throw CheckpointError(
        std::string(name) +
        " is not set: tide::checkpoint runs in a worker of tiderun");
  }
  return std::atoi(v);
}

// This process's view of its node's region, opened once.
std::mutex mutex;

Region& region() {
  static std::unique_ptr<Region> opened;
  if (!opened) {
    const char* path = std::getenv("TIDE_CHECKPOINT_REGION");
    if (path == nullptr || *path == '\0') {
      throw CheckpointError(
          "no checkpoint memory here: run the program under tiderun "
          "--checkpoint-memory SIZE (TIDE_CHECKPOINT_REGION is not set)");
    }
    try {
      opened = std::make_unique<Region>(path);
    } catch (const Error& e) {
      throw CheckpointError(e.what());
    }
  }
  return *opened;
}

// Same snapshot: its flags may change (the agent marks it copied).
bool still(Region& r, uint32_t slot, const SlotHead& h) {
  SlotHead now = r.head(slot);
  return now.state == kComplete && now.seq == h.seq && now.rank == h.rank &&
         now.step == h.step;
}

// Waits until the peer node's agent holds this rank's newest snapshot (see
// docs/checkpoints.md, "A copy on a peer node").
void wait_for_peer(Region& r, uint32_t slot, const SlotHead& h) {
  auto pause = std::chrono::microseconds(200);
  while (r.peer() && (r.head(slot).flags & kReplicated) == 0 &&
         still(r, slot, h)) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

}  // namespace

bool available() {
  const char* path = std::getenv("TIDE_CHECKPOINT_REGION");
  return path != nullptr && *path != '\0';
}

void save(const State& state, int64_t step) {
  if (step < 0) {
    throw CheckpointError(
        "save: step must be >= 0, got " + std::to_string(step));
  }
  std::lock_guard lock(mutex);
  Region& r = region();
  const int64_t rank = env_int("RANK");
  const int local = env_int("LOCAL_RANK");
  const Layout& l = r.layout();
  if (local < 0 || static_cast<uint32_t>(local) >= l.local_ranks) {
    throw CheckpointError(
        "save: local rank " + std::to_string(local) + " has no slot in " +
        r.path() + " (" + std::to_string(l.local_ranks) + " local ranks)");
  }
  std::vector<at::Tensor> tensors;
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& item : state) {
    const at::Tensor& t = item.value();
    if (t.layout() != at::kStrided || t.is_quantized()) {
      throw CheckpointError(
          "save: state['" + item.key() +
          "'] is not a dense tensor; only dense tensors are supported");
    }
    entries.push_back(
        {{"key", item.key()},
         {"dtype", dtype_name(t.scalar_type())},
         {"shape", t.sizes().vec()},
         {"device", t.device().str()}});
    tensors.push_back(
        t.device().is_cpu() && t.is_contiguous()
            ? t
            : t.detach().contiguous().cpu());
  }
  const std::string meta = nlohmann::json{
      {"format", "tide-state"},
      {"version", 1},
      {"tensors", entries}}.dump();
  uint64_t end = kHeaderBytes + align(meta.size());
  std::vector<uint64_t> offsets;
  for (const at::Tensor& t : tensors) {
    offsets.push_back(end);
    end += align(static_cast<uint64_t>(t.numel()) * t.element_size());
  }
  if (end > l.slot_bytes) {
    throw CheckpointError(
        "save: the state of step " + std::to_string(step) + " needs " +
        human_bytes(end) + " and a snapshot slot holds " +
        human_bytes(l.slot_bytes) + "; the previous snapshot is kept");
  }

  const uint32_t first = static_cast<uint32_t>(local) * l.own;
  std::map<uint32_t, SlotHead> heads;
  std::vector<std::pair<uint64_t, uint32_t>> ours;  // (seq, slot)
  uint64_t seq = 0;
  for (uint32_t s = first; s < first + l.own; ++s) {
    SlotHead h = r.head(s);
    heads[s] = h;
    if (h.state == kComplete) {
      seq = std::max(seq, h.seq);
      if (h.rank == rank) {
        ours.emplace_back(h.seq, s);
      }
    }
  }
  std::sort(ours.begin(), ours.end());
  if (!ours.empty() && r.peer()) {
    wait_for_peer(r, ours.back().second, heads[ours.back().second]);
  }
  // Over a slot with none of this rank's snapshots, else its oldest.
  uint32_t slot = ours.empty() ? first : ours.front().second;
  for (uint32_t s = first; s < first + l.own; ++s) {
    if (!(heads[s].state == kComplete && heads[s].rank == rank)) {
      slot = s;
      break;
    }
  }
  r.set_state(slot, kWriting);
  char* base = r.slot(slot);
  std::memcpy(base + kHeaderBytes, meta.data(), meta.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (t.numel() > 0) {
      std::memcpy(
          base + offsets[i],
          t.data_ptr(),
          static_cast<size_t>(t.numel()) * t.element_size());
    }
  }
  r.begin(
      slot,
      SlotHead{
          .seq = seq + 1,
          .step = step,
          .rank = rank,
          .meta_bytes = meta.size(),
          .data_bytes = end - kHeaderBytes - align(meta.size())});
  r.set_state(slot, kComplete);
}

Loaded load(State* into, std::optional<int64_t> step) {
  std::lock_guard lock(mutex);
  Region& r = region();
  const int64_t rank = env_int("RANK");
  const Layout& l = r.layout();
  std::map<int64_t, std::pair<uint32_t, SlotHead>> held;  // step -> newest
  for (uint32_t s = 0; s < l.slots; ++s) {
    SlotHead h = r.head(s);
    if (h.state == kComplete && h.rank == rank &&
        (!held.contains(h.step) || h.seq > held[h.step].second.seq)) {
      held[h.step] = {s, h};
    }
  }
  Loaded out;
  out.source = "none";
  if (held.empty() && !step) {
    return out;
  }
  auto it = step ? held.find(*step) : std::prev(held.end());
  if (it == held.end()) {
    std::string steps;
    for (const auto& [s, _] : held) {
      steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    }
    throw CheckpointError(
        "load: rank " + std::to_string(rank) + " holds no snapshot of step " +
        std::to_string(*step) + " (it holds " +
        (steps.empty() ? "none" : steps) + ")");
  }
  const auto [slot, head] = it->second;
  const char* base = r.slot(slot);
  std::string meta(base + kHeaderBytes, head.meta_bytes);
  if (meta.empty() || meta[0] != '{') {
    throw CheckpointError(
        "load: the snapshot of step " + std::to_string(head.step) +
        " was saved from Python with values other than tensors; save a dict "
        "of tensors with string keys to load it here");
  }
  out.step = head.step;
  out.source = slot >= l.replicas_from || (head.flags & kFromPeer) != 0
                   ? "peer"
                   : "memory";
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(meta);
    uint64_t at = kHeaderBytes + align(meta.size());
    for (const auto& e : doc.at("tensors")) {
      const std::string key = e.at("key").get<std::string>();
      const at::ScalarType dtype = dtype_of(e.at("dtype").get<std::string>());
      const auto shape = e.at("shape").get<std::vector<int64_t>>();
      const at::Device device(e.at("device").get<std::string>());
      at::Tensor cpu = at::empty(shape, at::TensorOptions().dtype(dtype));
      const uint64_t nbytes =
          static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
      if (at + nbytes > kHeaderBytes + head.payload()) {
        throw CheckpointError("load: a snapshot's tensors run past its slot");
      }
      if (nbytes > 0) {
        std::memcpy(cpu.data_ptr(), base + at, nbytes);
      }
      at += align(nbytes);
      at::Tensor* target = into != nullptr ? into->find(key) : nullptr;
      if (target == nullptr) {
        out.state.insert(key, device.is_cpu() ? cpu : cpu.to(device));
        continue;
      }
      if (target->sizes() != cpu.sizes() || target->scalar_type() != dtype) {
        throw CheckpointError(
            "load: state['" + key + "'] was saved as " +
            e.at("dtype").get<std::string>() + " " + e.at("shape").dump() +
            " and is " + dtype_name(target->scalar_type()) + " " +
            nlohmann::json(target->sizes().vec()).dump() + " here");
      }
      c10::NoGradGuard no_grad;
      target->copy_(cpu);
      out.state.insert(key, *target);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        std::string("load: a snapshot's meta is not tide's (") + e.what() +
        ")");
  }
  return out;
}

}  // namespace tide::checkpoint
