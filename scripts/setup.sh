#!/usr/bin/env bash
# Installs every Debian package tide's build, tests and benchmarks need.
# Idempotent: when everything is already installed it only checks and returns.
# Usage: scripts/setup.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache mold pkg-config git
  clang libclang-rt-14-dev clang-format clang-tidy
  # libraries
  libasio-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev libcivetweb-dev libcurl4-openssl-dev
  # the rpc transport's handshake (HMAC-SHA256, random nonces)
  libssl-dev
  # the etcd rendezvous backend's tests and benchmark start their own etcd
  etcd-server etcd-client
  # the peer: PyTorch 1.13.1 for interop tests and benchmarks
  python3 python3-torch
  # libtorch for tide's rpc tensors (tide/rpc/tensor.h users, their tests)
  libtorch-dev
  # the torch.distributed.rpc backend (python/tide/torch_rpc): pybind11 2.10, as torch was built with
  pybind11-dev python3-dev
  # tools the tests use
  procps iproute2 curl
  # stacks of hung workers (tiderun --heartbeat-timeout): eu-stack, else gdb
  elfutils gdb
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q -o DPkg::Lock::Timeout=900
$sudo apt-get install -y -q -o DPkg::Lock::Timeout=900 --no-install-recommends "${missing[@]}"
echo "setup: done"
