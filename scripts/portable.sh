#!/usr/bin/env bash
# Makes a self-contained tiderun for other glibc distributions (Ubuntu-based
# training images, say): tiderun, tide-store and tide-timeline with every
# shared library they load except the C library's own (libc, libm,
# libresolv, the dynamic loader), libstdc++ included, found through
# $ORIGIN-relative run paths. Nothing is installed; unpack anywhere.
#
#   scripts/portable.sh [BUILD_DIR] [OUT_DIR]
#     BUILD_DIR  a build holding apps/tiderun (default: build)
#     OUT_DIR    where tide-<version>-linux-<arch>/ and its .tar.gz go
#                (default: BUILD_DIR/portable)
#
# Prints the tarball's path and the oldest glibc it runs on. Needs patchelf
# (scripts/setup.sh installs it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$build/portable}
command -v patchelf >/dev/null || { echo "portable.sh: needs patchelf" >&2; exit 2; }
[[ -x $build/apps/tiderun ]] || { echo "portable.sh: no $build/apps/tiderun" >&2; exit 2; }
version=$("$build/apps/tiderun" --version | awk '{print $2}')
name=tide-$version-linux-$(uname -m)
dir=$out/$name
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
programs=(tiderun tide-store tide-timeline)
for p in "${programs[@]}"; do
  cp "$build/apps/$p" "$dir/bin/"
done
# What the C library's package itself provides stays the system's: it is
# on every glibc distribution, and mixing two of it in one process breaks.
is_glibc() {
  [[ $1 =~ ^(linux-vdso|ld-linux|libc\.so|libm\.so|libresolv\.so|libpthread\.so|libdl\.so|librt\.so) ]]
}
for p in "${programs[@]}"; do
  ldd "$dir/bin/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r lib path; do
  if ! is_glibc "$lib"; then
    cp -L "$path" "$dir/lib/$lib"
  fi
done
strip --strip-unneeded "$dir"/bin/* "$dir"/lib/*
for p in "${programs[@]}"; do
  patchelf --set-rpath '$ORIGIN/../lib' "$dir/bin/$p"
done
for l in "$dir"/lib/*; do
  patchelf --set-rpath '$ORIGIN' "$l"
done
cp "$root/LICENSE" "$dir/"
glibc=$(for f in "$dir"/bin/* "$dir"/lib/*; do objdump -T "$f"; done |
  grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
echo "${glibc#GLIBC_}" >"$dir/GLIBC_MINIMUM"
tar -C "$out" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz (needs glibc ${glibc#GLIBC_} or newer)"
