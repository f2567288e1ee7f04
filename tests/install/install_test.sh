#!/usr/bin/env bash
# tide as a user gets it: installed with `cmake --install`, or as the Debian
# packages `cpack -G DEB` makes. Run by ctest (tests/CMakeLists.txt):
#
#   install_test.sh SOURCE_DIR BUILD_DIR prefix    install into a prefix, build
#       the consumer (tests/install/consumer) with find_package(tide) and an
#       rpc program with pkg-config, run them with the installed tiderun
#   install_test.sh SOURCE_DIR BUILD_DIR packages  make tide and tide-dev,
#       check their dependencies and contents
#   install_test.sh SOURCE_DIR BUILD_DIR unpacked  unpack both packages into a
#       root and run and build from there (needs `packages` first)
#   install_test.sh SOURCE_DIR BUILD_DIR apt       `apt-get install ./tide_*.deb`,
#       tiderun from PATH, then remove it (root only; 77 = skipped)
#
# Work goes to BUILD_DIR/install_test/, at fixed paths so that ccache serves
# a rerun.
set -euo pipefail
src=$1 build=$2 mode=$3
work=$build/install_test
packages=$work/packages
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tide-ccache}
mkdir -p "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

# expect_output PATTERN CMD...: runs CMD, shows its output, requires PATTERN.
expect_output() {
  local pattern=$1 out status=0
  shift
  out=$("$@" 2>&1) || status=$?
  if ((status != 0)); then
    echo "$out"
    fail "exit $status: $*"
  fi
  echo "$out"
  grep -qE -- "$pattern" <<<"$out" || fail "no '$pattern' in the output of $*"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# consumer PREFIX DIR [TARGET...]: configures and builds the consumer
# project against the tide installed in PREFIX.
consumer() {
  local prefix=$1 dir=$2
  shift 2
  rm -rf "$dir"
  cmake -S "$src/tests/install/consumer" -B "$dir" -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" -DTIDE_EXAMPLES="$src/examples" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" \
    -DCMAKE_BUILD_TYPE=Release |
    grep -E '^-- tide ' || fail "the consumer did not find tide in $prefix"
  cmake --build "$dir" -j"$(nproc)" ${1:+--target "$@"}
}

# run_installed BIN_DIR CONSUMER_DIR: the consumer's programs, with the
# installed tiderun.
run_installed() {
  local bin=$1 dir=$2
  step "$dir/rpc_hello under the installed tiderun"
  expect_output 'worker2: add\(2, 40\) = 42; hello driver from worker2' \
    "$bin/tiderun" --standalone --nproc-per-node=3 --no-python "$dir/rpc_hello"
}

# run_plugin BIN_DIR CONSUMER_DIR: the consumer's rendezvous plugin, built
# on tide::headers, loaded by the installed tiderun.
run_plugin() {
  local bin=$1 dir=$2
  step "the hostlist rendezvous plugin, loaded by the installed tiderun"
  expect_output 'it adds the backends: hostlist' "$bin/tiderun" \
    --rdzv-plugin="$dir/libhostlist_rendezvous.so" \
    --rdzv-backend=hostlist --rdzv-endpoint=127.0.0.1 \
    --rdzv-conf=port="$(free_port)" --nnodes=1 --local-addr=127.0.0.1 \
    --no-python /bin/true
}

case $mode in
prefix)
  prefix=$work/prefix
  rm -rf "$prefix"
  step "cmake --install $build --prefix $prefix"
  cmake --install "$build" --prefix "$prefix" >/dev/null
  for f in bin/tiderun bin/tide-store bin/tide-timeline \
      include/tide/rpc/rpc.h include/tide/agent/local_elastic_agent.h \
      lib/libtide_rpc.a lib/libtide_agent.a lib/cmake/tide/tideConfig.cmake \
      lib/cmake/tide/tideConfigVersion.cmake lib/pkgconfig/tide-rpc.pc \
      lib/pkgconfig/tide-elastic.pc; do
    [[ -e $prefix/$f ]] || fail "$f is not installed"
  done

  step "the consumer, with find_package(tide)"
  consumer "$prefix" "$work/consumer"
  # What the rpc program's link line names: the rpc part and the parts under
  # it (the metrics registry among them, prometheus-cpp's core with it),
  # nothing of the elastic half and no HTTP server.
  link=$(ninja -C "$work/consumer" -t commands rpc_hello | tail -n 1)
  grep -q 'libtide_rpc\.a' <<<"$link" || fail "rpc_hello does not link libtide_rpc.a: $link"
  if grep -oE 'libtide_(agent|launcher|rendezvous|etcd|events|timer|metrics_http)\.a|civetweb|prometheus-cpp-pull|curl' <<<"$link"; then
    fail "rpc_hello links the above: $link"
  fi

  step "my_launcher (a custom launcher on LocalElasticAgent), one restart"
  expect_output 'worker 0 returned: rank 0 of 2 finished attempt 1' \
    "$work/consumer/my_launcher" --nproc 2 --fail-once

  run_installed "$prefix/bin" "$work/consumer"
  run_plugin "$prefix/bin" "$work/consumer"


  step "pkg-config: tide-rpc names no elastic part; rpc_hello built with it"
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  libs=$(pkg-config --libs tide-rpc)
  echo "pkg-config --libs tide-rpc: $libs"
  grep -q -- '-ltide_rpc' <<<"$libs" || fail "no -ltide_rpc"
  if grep -oE -- '-ltide_(agent|launcher|rendezvous|etcd|metrics_http)|civetweb|prometheus-cpp-pull|curl' <<<"$libs"; then
    fail "tide-rpc.pc names the above"
  fi
  pkg-config --exists --print-errors tide-elastic
  mkdir -p "$work/pc"
  # shellcheck disable=SC2046  # pkg-config's words are flags
  $(command -v ccache || true) c++ -std=c++20 -O1 "$src/examples/rpc_hello.cpp" \
    $(pkg-config --cflags tide-rpc) -o "$work/pc/rpc_hello" $(pkg-config --libs tide-rpc)
  run_installed "$prefix/bin" "$work/pc"
  ;;

packages)
  rm -rf "$packages"
  step "cpack -G DEB"
  (cd "$build" && cpack -G DEB -B "$packages") >"$work/cpack.log" 2>&1 ||
    { cat "$work/cpack.log"; fail "cpack failed"; }
  ls -l "$packages"/*.deb
  deb=$(echo "$packages"/tide_*.deb) dev=$(echo "$packages"/tide-dev_*.deb)
  [[ -f $deb && -f $dev ]] || fail "no tide_*.deb and tide-dev_*.deb in $packages"
  dpkg-deb --info "$deb"
  dpkg-deb --info "$dev"
  depends=$(dpkg-deb --field "$deb" Depends)
  # dpkg-shlibdeps' answer: the runtime libraries tiderun links.
  for p in libc6 libstdc++6 libspdlog libfmt libcurl libcivetweb; do
    grep -q "$p" <<<"$depends" || fail "tide's Depends lacks $p: $depends"
  done
  dev_depends=$(dpkg-deb --field "$dev" Depends)
  for p in libspdlog-dev libfmt-dev nlohmann-json3-dev prometheus-cpp-dev \
      libcivetweb-dev libcurl4-openssl-dev; do
    grep -q "$p" <<<"$dev_depends" || fail "tide-dev's Depends lacks $p: $dev_depends"
  done
  files=$(dpkg-deb --contents "$deb" | awk '{print $NF}' | grep -v '/$')
  echo "$files"
  [[ $(grep -vEc '^\./usr/(bin/|share/doc/tide/copyright$)' <<<"$files") == 0 ]] ||
    fail "tide holds more than programs and its copyright file"
  # Each package names its licence as Debian's policy asks.
  for p in "$deb" "$dev" "$packages"/python3-tide_*.deb; do
    name=$(dpkg-deb --field "$p" Package)
    rm -rf "$work/doc" && dpkg-deb -x "$p" "$work/doc"
    copyright=$work/doc/usr/share/doc/$name/copyright
    [[ -f $copyright ]] || fail "$name has no /usr/share/doc/$name/copyright"
    grep -q '^License: BSD-3-Clause$' "$copyright" || fail "$name's copyright names no BSD-3-Clause"
    grep -q '^ Redistribution and use in source and binary forms' "$copyright" ||
      fail "$name's copyright lacks the licence text"
  done
  dev_files=$(dpkg-deb --contents "$dev")
  for f in usr/lib/cmake/tide/tideConfig.cmake usr/lib/libtide_rpc.a \
      usr/lib/pkgconfig/tide-elastic.pc usr/include/tide/rpc/rpc.h; do
    grep -q "\./$f\$" <<<"$dev_files" || fail "tide-dev lacks $f"
  done
  py=$(echo "$packages"/python3-tide_*.deb)
  [[ -f $py ]] || fail "no python3-tide_*.deb in $packages"
  py_files=$(dpkg-deb --contents "$py")
  for f in __init__.py torch_rpc.py _torch_rpc.cpython- _elastic.cpython- \
      elastic/agent/server/local_elastic_agent.py elastic/_worker.py; do
    grep -q "\./usr/lib/python3/dist-packages/tide/$f" <<<"$py_files" || fail "python3-tide lacks tide/$f*"
  done
  grep -q python3-torch <<<"$(dpkg-deb --field "$py" Depends)" || fail "python3-tide does not depend on python3-torch"
  # Stripped: the programs and the archives carry no debugging sections.
  rm -rf "$work/peek" && dpkg-deb -x "$deb" "$work/peek"
  if readelf -S "$work/peek/usr/bin/tiderun" | grep -q '\.debug_info'; then
    fail "tiderun in the package is not stripped"
  fi
  ;;

unpacked)
  root=$work/root
  rm -rf "$root"
  for deb in "$packages"/tide_*.deb "$packages"/tide-dev_*.deb "$packages"/python3-tide_*.deb; do
    [[ -f $deb ]] || fail "no packages in $packages (run the packages step first)"
    dpkg-deb -x "$deb" "$root"
  done
  step "the unpacked tiderun runs a standalone job"
  "$root/usr/bin/tiderun" --standalone --nproc-per-node=2 --no-python /bin/true
  step "the unpacked python3-tide serves torch.distributed.rpc"
  PYTHONPATH="$root/usr/lib/python3/dist-packages" /usr/bin/python3 -c '
import torch, torch.distributed.rpc as rpc, tide.torch_rpc
opts = tide.torch_rpc.TideRpcBackendOptions(init_method="tcp://127.0.0.1:'"$(free_port)"'")
rpc.init_rpc("solo", rank=0, world_size=1, backend=rpc.BackendType.TIDE, rpc_backend_options=opts)
assert torch.equal(rpc.rpc_sync("solo", torch.add, args=(torch.ones(2), 1)), torch.full((2,), 2.0))
rpc.shutdown()' || fail "the unpacked python3-tide does not run a call"
  step "the unpacked python3-tide runs tide.elastic's agent"
  PYTHONPATH="$root/usr/lib/python3/dist-packages" /usr/bin/python3 -c '
import os
from tide.elastic.agent.server.api import WorkerSpec
from tide.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from tide.elastic.rendezvous import RendezvousParameters
from tide.elastic.rendezvous.registry import get_rendezvous_handler
handler = get_rendezvous_handler(RendezvousParameters("c10d", "127.0.0.1:'"$(free_port)"'", "pkg", 1, 1))
spec = WorkerSpec(role="w", local_world_size=2, entrypoint=os.getcwd, rdzv_handler=handler)
result = LocalElasticAgent(spec).run()
assert result.return_values == {0: os.getcwd(), 1: os.getcwd()}, result' \
    || fail "the unpacked python3-tide does not run tide.elastic's agent"
  step "the unpacked tide-dev serves find_package(tide)"
  consumer "$root/usr" "$work/consumer-deb" rpc_hello hostlist_rendezvous
  run_installed "$root/usr/bin" "$work/consumer-deb"
  run_plugin "$root/usr/bin" "$work/consumer-deb"
  ;;

apt)
  if [[ $(id -u) != 0 ]]; then
    echo "skipped: installing a package needs root"
    exit 77
  fi
  if dpkg-query -W -f='${Status}' tide 2>/dev/null | grep -q 'ok installed'; then
    echo "skipped: a tide package is already installed; this test does not replace it"
    exit 77
  fi
  deb=$(echo "$packages"/tide_*.deb)
  [[ -f $deb ]] || fail "no tide_*.deb in $packages (run the packages step first)"
  trap 'apt-get remove -y -q -o DPkg::Lock::Timeout=120 tide >/dev/null || true' EXIT
  step "apt-get install ./$(basename "$deb")"
  (cd "$packages" && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends -o DPkg::Lock::Timeout=120 "./$(basename "$deb")")
  [[ $(command -v tiderun) == /usr/bin/tiderun ]] ||
    fail "tiderun is not on PATH as /usr/bin/tiderun: $(command -v tiderun || true)"
  step "tiderun --standalone from PATH"
  tiderun --standalone --nproc-per-node=2 --no-python /bin/true
  step "apt-get remove tide"
  trap - EXIT
  apt-get remove -y -q -o DPkg::Lock::Timeout=120 tide
  [[ ! -e /usr/bin/tiderun ]] || fail "/usr/bin/tiderun is still there after the removal"
  ;;

*)
  fail "unknown mode '$mode' (prefix, packages, unpacked or apt)"
  ;;
esac
echo "== passed"
