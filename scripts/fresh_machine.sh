#!/usr/bin/env bash
# Times the README's two commands as on a fresh Debian 12 machine: a new
# bookworm root (debootstrap, minbase), a clean clone of this repository's
# HEAD in it, no ccache, then `scripts/demo.sh` or `scripts/test.sh` run
# inside it with chroot, apt-get's downloads and installs included. Prints
# the wall time of the command. As root; needs the network to reach Debian's
# archive (as apt-get does).
#
#   scripts/fresh_machine.sh demo [ROOT]       # default ROOT: /tmp/tide-fresh
#   scripts/fresh_machine.sh test [ROOT]
#   scripts/fresh_machine.sh setup [ROOT]      # scripts/setup.sh alone (apt)
#
# The root is made anew each time (about a minute, ~300 MB) and removed at
# the end unless KEEP_ROOT=1.
set -euo pipefail
what=${1:?usage: fresh_machine.sh demo|test|setup [ROOT]}
root=${2:-/tmp/tide-fresh}
repo=$(cd "$(dirname "$0")/.." && pwd)
case $what in
demo) command=scripts/demo.sh ;;
test) command=scripts/test.sh ;;
setup) command=scripts/setup.sh ;;
*) echo "fresh_machine.sh: unknown command '$what' (demo, test or setup)" >&2; exit 2 ;;
esac
if [[ $(id -u) -ne 0 ]]; then
  echo "fresh_machine.sh: run as root (debootstrap, chroot, mounts)" >&2
  exit 2
fi
if ! command -v debootstrap >/dev/null; then
  apt-get install -y -q --no-install-recommends debootstrap >/dev/null
fi

cleanup() {
  # run/netns: where the tests' network namespaces leave a mount.
  for m in run/netns dev/pts dev proc sys; do
    umount -l "$root/$m" 2>/dev/null || true
  done
  if [[ ${KEEP_ROOT:-0} != 1 ]]; then
    rm -rf "$root"
  fi
}
trap cleanup EXIT
cleanup
mkdir -p "$root"
echo "== debootstrap bookworm (minbase) into $root"
debootstrap --variant=minbase --include=ca-certificates,git,sudo bookworm \
  "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log"; exit 1; }
cp /etc/resolv.conf "$root/etc/resolv.conf"
# What Debian's installer writes and debootstrap does not: without it
# "localhost" does not resolve (torch's agent looks it up).
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
  "$(hostname)" >"$root/etc/hosts"
cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/" 2>/dev/null &&
  rm -f "$root/etc/apt/sources.list" || true
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
git clone -q "$repo" "$root/work/tide"

echo "== $command in the fresh root"
start=$(date +%s)
status=0
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash -c "cd /work/tide && $command" || status=$?
end=$(date +%s)
echo "== $command on a fresh machine: $((end - start)) s, exit status $status"
exit $status
