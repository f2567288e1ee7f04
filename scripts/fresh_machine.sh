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
source "$repo/scripts/lib/debian_root.sh"

cleanup() {
  debian_root_unmount "$root"
  if [[ ${KEEP_ROOT:-0} != 1 ]]; then
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
cleanup
echo "== debootstrap bookworm (minbase) into $root"
debian_root_make "$root" bookworm git,sudo
cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/" 2>/dev/null &&
  rm -f "$root/etc/apt/sources.list" || true
debian_root_mount "$root"
git clone -q "$repo" "$root/work/tide"

echo "== $command in the fresh root"
start=$(date +%s)
status=0
debian_root_run "$root" "cd /work/tide && $command" || status=$?
end=$(date +%s)
echo "== $command on a fresh machine: $((end - start)) s, exit status $status"
exit $status
