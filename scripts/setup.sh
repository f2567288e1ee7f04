#!/usr/bin/env bash
# Installs the Debian packages tide needs. Idempotent: when everything is
# already installed it only checks and returns.
#
#   scripts/setup.sh        everything the build, the tests and the
#                           benchmarks need
#   scripts/setup.sh demo   what scripts/demo.sh needs: the compiler and the
#                           elastic half's libraries (no libtorch, clang or
#                           test tools), and Debian's PyTorch for its DDP
#                           script
#   scripts/setup.sh unit   what building the unit tests needs (the elastic
#                           half's and GoogleTest's); scripts/test.sh starts
#                           the sanitizer builds on it while the rest installs
#   scripts/setup.sh torch  what building and running the tests that involve
#                           torch needs (scripts/torch2.sh's Debian 13 root)
#
# Debian 12 and 13 alike (their package names here are the same).
#
# As root, or with sudo available.
set -euo pipefail
profile=${1:-all}

# The elastic half (tiderun, tide-store, tide's rpc) and its build.
packages=(
  build-essential cmake ninja-build ccache mold pkg-config git
  libasio-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  prometheus-cpp-dev libcivetweb-dev libcurl4-openssl-dev
  # the rpc transport's handshake (HMAC-SHA256, random nonces)
  libssl-dev
)
case $profile in
demo)
  # the DDP script the demo runs under tiderun
  packages+=(python3 python3-torch)
  ;;
unit)
  packages+=(libgtest-dev libgmock-dev)
  ;;
torch)
  packages+=(libgtest-dev libgmock-dev python3 python3-torch libtorch-dev pybind11-dev
    python3-dev procps iproute2 curl file elfutils gdb
    # torch 2.x's torch.testing._internal (its RPC suites) imports setuptools;
    # pip install . into a virtual environment (its test)
    python3-setuptools python3-venv python3-pip python3-wheel)
  ;;
all)
  packages+=(
    # (libclang-rt-dev: the runtimes of Debian's default clang, 14 in Debian 12, 19 in 13)
    clang libclang-rt-dev clang-format clang-tidy
    libgtest-dev libgmock-dev libbenchmark-dev
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
    # scripts/portable.sh (tiderun for other distributions) and its test
    patchelf
    # cpack's Debian packages (their shared-library dependencies)
    file
    # pip install . into a virtual environment (its test), offline
    python3-venv python3-pip python3-setuptools python3-wheel
    # stacks of hung workers (tiderun --heartbeat-timeout): eu-stack, else gdb
    elfutils gdb
    # scripts/torch2.sh's Debian 13 root (the tests beside torch 2.6)
    debootstrap
    # the live job page's browser test (headless) and the Prometheus scrape
    # test (prometheus, promtool)
    chromium prometheus
  )
  ;;
*)
  echo "setup.sh: unknown profile '$profile' (demo, unit, torch, or nothing for all)" >&2
  exit 2
  ;;
esac

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
# --force-unsafe-io: no fsync per unpacked file (a fresh machine installs
# hundreds of packages; a crash mid-way means running this again anyway).
$sudo apt-get install -y -q -o DPkg::Lock::Timeout=900 \
  -o Dpkg::Options::=--force-unsafe-io --no-install-recommends "${missing[@]}"
echo "setup: done"
