#!/usr/bin/env bash
# The portable tiderun (scripts/portable.sh) in a root that holds the C
# library and a shell and nothing else: no libstdc++, no Debian C++ library.
# A two-worker standalone job must run there to the end, and tide-store
# must start. Run by ctest as root (chroot and mounts); 77 = skipped.
#
#   portable_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$build/portable_test
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: needs root for chroot"
  exit 77
fi
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work"
tarball=$("$src/scripts/portable.sh" "$build" "$work/out" | tail -1 | awk '{print $1}')
[[ -f $tarball ]] || fail "scripts/portable.sh made no tarball"
echo "tarball: $tarball ($(du -h "$tarball" | cut -f1))"

root=$work/root
cleanup() {
  umount -l "$root/proc" 2>/dev/null || true
  umount -l "$root/dev" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$root"/{bin,opt,tmp,proc,dev,etc}
chmod 1777 "$root/tmp"
# The C library's package (libc6: the loader, libc, libm, libresolv and
# the compatibility stubs), as the loader finds it, and dash.
libdir=$(dirname "$(ldd /bin/dash | awk '$1 ~ /^libc\.so/ {print $3}')")
for f in /lib64/ld-linux-x86-64.so.2 "$libdir"/{libc.so.6,libm.so.6,libresolv.so.2,libpthread.so.0,libdl.so.2,librt.so.1}; do
  mkdir -p "$root$(dirname "$f")"
  cp -L "$f" "$root$f"
done
cp /bin/dash "$root/bin/sh"
echo "127.0.0.1 localhost" >"$root/etc/hosts"
tar -C "$root/opt" -xzf "$tarball"
tide=$(basename "$tarball" .tar.gz)
# Nothing of C++ in the root but what the tarball brought.
if find "$root" -name 'libstdc++*' -not -path "$root/opt/$tide/*" | grep -q .; then
  fail "the test root has a libstdc++ of its own"
fi
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"

cat >"$root/worker.sh" <<'W'
#!/bin/sh
echo "hello from $RANK of $WORLD_SIZE"
W
chmod +x "$root/worker.sh"
out=$(chroot "$root" "/opt/$tide/bin/tiderun" --standalone --nproc-per-node=2 \
  --log-dir /tmp/logs /worker.sh 2>&1) || { echo "$out"; fail "tiderun failed in the root"; }
echo "$out"
for r in 0 1; do
  grep -q "hello from $r of 2" <<<"$out" || fail "no output from rank $r"
done
version=$(chroot "$root" "/opt/$tide/bin/tide-store" --version) ||
  fail "tide-store does not start in the root"
echo "$version"
echo "PASS: $tide runs in a root without C++ libraries (needs glibc $(cat "$root/opt/$tide/GLIBC_MINIMUM"))"
