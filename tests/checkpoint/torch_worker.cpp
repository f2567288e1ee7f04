// A libtorch worker of tests/apps/checkpoint_test.py, on the C++ twin of
// tide.checkpoint (include/tide/checkpoint/checkpoint.h):
//
//   torch_worker save STEP    saves state_of(STEP) as the snapshot of STEP
//   torch_worker check STEP   loads, new and in place, and checks that it
//                             is state_of(STEP) bit for bit
//   torch_worker dies         attempt 0: saves steps 0-4, then the last
//                             rank SIGKILLs itself once the others saved;
//                             attempt 1: check 4
//
// tests/apps/checkpoint/interop.py computes the same state_of in Python.
// Exit status 0 when all holds; 1 with why on stderr.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "tide/checkpoint/checkpoint.h"

namespace ck = tide::checkpoint;

namespace {

int env(const char* name) {
  return std::atoi(std::getenv(name));
}

// Every kind the API takes, different at each step and rank, and exactly
// representable, so Python computes the same bytes.
ck::State state_of(int64_t step) {
  const int64_t rank = env("RANK");
  ck::State s;
  s.insert(
      "w",
      at::arange(24, at::kFloat).reshape({4, 6}) *
              static_cast<double>(step + 1) +
          static_cast<double>(rank));
  s.insert(
      "half",
      (at::arange(10, at::kFloat) * static_cast<double>(step))
          .to(at::kBFloat16));
  s.insert("ids", at::arange(5, at::kLong) * (rank + 1) + step);
  s.insert("mask", at::arange(7, at::kLong).remainder(2) == step % 2);
  s.insert(
      "scalar",
      at::scalar_tensor(static_cast<double>(step) * 0.5, at::kDouble));
  s.insert("empty", at::empty({0, 3}, at::kFloat));
  s.insert(
      "strided",
      at::arange(12, at::kFloat).reshape({3, 4}).t() +
          static_cast<double>(step));
  return s;
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  at::Tensor x = a.contiguous();
  at::Tensor y = b.contiguous();
  return std::memcmp(
             x.data_ptr(),
             y.data_ptr(),
             static_cast<size_t>(x.numel()) * x.element_size()) == 0;
}

int check(int64_t step) {
  ck::State want = state_of(step);
  ck::Loaded fresh = ck::load();
  if (fresh.step != step) {
    std::cerr << "loaded step " << (fresh.step ? *fresh.step : -1) << ", not "
              << step << "\n";
    return 1;
  }
  for (const auto& item : want) {
    const at::Tensor* got = fresh.state.find(item.key());
    if (got == nullptr || !same_bytes(*got, item.value())) {
      std::cerr << "state['" << item.key() << "'] differs (new)\n";
      return 1;
    }
  }
  // In place: the target's own tensors get the bytes.
  ck::State target = state_of(0);
  const void* w = target["w"].data_ptr();
  ck::Loaded in_place = ck::load(&target);
  for (const auto& item : want) {
    if (!same_bytes(target[item.key()], item.value())) {
      std::cerr << "state['" << item.key() << "'] differs (in place)\n";
      return 1;
    }
  }
  if (target["w"].data_ptr() != w || in_place.state["w"].data_ptr() != w) {
    std::cerr << "the load was not in place\n";
    return 1;
  }
  // The wrong shape is a clear error.
  ck::State wrong;
  wrong.insert("w", at::zeros({5}, at::kFloat));
  try {
    ck::load(&wrong);
    std::cerr << "a tensor of another shape loaded\n";
    return 1;
  } catch (const ck::CheckpointError& e) {
    if (std::string(e.what()).find("was saved as float32 [4,6]") ==
        std::string::npos) {
      std::cerr << "unclear error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cout << "rank " << env("RANK") << ": step " << step << " from "
            << fresh.source << ", bit for bit\n";
  return 0;
}

int dies() {
  const std::string out = std::getenv("OUT");
  if (env("TORCHELASTIC_RESTART_COUNT") > 0) {
    return check(4);
  }
  for (int64_t step = 0; step < 5; ++step) {
    ck::save(state_of(step), step);
  }
  std::ofstream(out + "/saved." + std::to_string(env("RANK"))) << "4";
  if (env("RANK") == env("WORLD_SIZE") - 1) {
    // Once the other ranks have saved too.
    for (int r = 0; r < env("WORLD_SIZE"); ++r) {
      while (!std::filesystem::exists(out + "/saved." + std::to_string(r))) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    ::kill(::getpid(), SIGKILL);
  }
  std::this_thread::sleep_for(
      std::chrono::seconds(60));  // stopped by the agent
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "save" && argc == 3) {
      ck::save(state_of(std::atoll(argv[2])), std::atoll(argv[2]));
      return 0;
    }
    if (mode == "check" && argc == 3) {
      return check(std::atoll(argv[2]));
    }
    if (mode == "dies") {
      return dies();
    }
    std::cerr << "usage: torch_worker save STEP | check STEP | dies\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "torch_worker: " << e.what() << "\n";
    return 1;
  }
}
