#!/usr/bin/env bash
# tide beside today's torch: a Debian 13 root with Debian's PyTorch 2.6 and
# tide's build dependencies, made once and kept (a second run only checks
# its packages), the repository mounted at /src in it and tide built at
# /build there, against libtorch 2.6 and Python 3.13. As root.
#
#   scripts/torch2.sh                  # make/update the root, build, run the torch tests
#   scripts/torch2.sh root             # make/update the root only
#   scripts/torch2.sh build            # make/update the root and build
#   scripts/torch2.sh run 'COMMAND'    # COMMAND in the root, from /src (after a build)
#
# scripts/test.sh runs it: the root and its build in the background, the
# tests at the end. The tests are those that involve torch (ctest labels
# torch_rpc, elastic_py, interop, prestart, checkpoint, and pip: pip install
# . into a venv on torch 2.6); the build is what they need.
#
# TIDE_TORCH2_ROOT: where the root lives (default /var/cache/tide/trixie,
# about 3 GB with a build).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${TIDE_TORCH2_ROOT:-/var/cache/tide/trixie}
what=${1:-test}
if [[ $(id -u) -ne 0 ]]; then
  echo "torch2.sh: run as root (debootstrap, chroot, mounts)" >&2
  exit 2
fi
source "$repo/scripts/lib/debian_root.sh"

if [[ ! -f $root/.tide-root ]]; then
  echo "== a Debian 13 root in $root (debootstrap)"
  rm -rf "$root"
  debian_root_make "$root" trixie
  touch "$root/.tide-root"
fi
trap 'debian_root_unmount "$root" src' EXIT
debian_root_mount "$root"
mkdir -p "$root/src"
mountpoint -q "$root/src" || mount --bind "$repo" "$root/src"
echo "== packages (scripts/setup.sh torch)"
debian_root_run "$root" "/src/scripts/setup.sh torch"

build() {
  echo "== build against libtorch $(debian_root_run "$root" \
    "dpkg-query -W -f='\${Version}' libtorch-dev") in /build"
  debian_root_run "$root" "cd /src && scripts/build.sh /build -DTIDE_BUILD_TESTS=ON \
    -DTIDE_TESTS=integration -DTIDE_FUZZ_TESTS=OFF -DTIDE_BUILD_BENCH=OFF -DTIDE_WITH_TORCH=ON \
    -DTIDE_WITH_PYTHON=ON -- tiderun tide-store tide-timeline tide_elastic_module \
    tide_torch_rpc_module tide_interop_tests tide_torch_rpc_tests tide_checkpoint_torch_worker"
}
case $what in
root) ;;
build) build ;;
test)
  build
  echo "== the tests that involve torch"
  debian_root_run "$root" "ctest --test-dir /build --output-on-failure -j2 --timeout 600 \
    -L 'torch_rpc|elastic_py|interop|prestart|pip|checkpoint'"
  ;;
run)
  debian_root_run "$root" "cd /src && ${2:?torch2.sh run 'COMMAND'}"
  ;;
*)
  echo "torch2.sh: unknown command '$what' (test, root, build or run)" >&2
  exit 2
  ;;
esac
