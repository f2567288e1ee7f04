# Debian roots for scripts/fresh_machine.sh (a fresh Debian 12) and
# scripts/torch2.sh (Debian 13 with its PyTorch 2.6): made with debootstrap,
# mounted as a machine's are, commands run in them with chroot. Sourced; as
# root. Each function takes the root's directory first.

# debian_root_make ROOT SUITE [PACKAGES]: a minimal root of SUITE
# (bookworm, trixie) with PACKAGES (comma-separated) and what every root
# here needs: DNS, and an /etc/hosts where localhost resolves (what Debian's
# installer writes and debootstrap does not; torch's agent looks it up).
debian_root_make() {
  local root=$1 suite=$2 extra=${3:+,$3}
  if ! command -v debootstrap >/dev/null; then
    apt-get install -y -q -o DPkg::Lock::Timeout=900 --no-install-recommends \
      debootstrap >/dev/null
  fi
  mkdir -p "$root"
  debootstrap --variant=minbase --include="ca-certificates$extra" "$suite" \
    "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log"; return 1; }
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
}

# debian_root_mount ROOT: proc, sysfs, /dev and /dev/pts, the host's DNS.
debian_root_mount() {
  local root=$1
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/sys" || mount -t sysfs sys "$root/sys"
  mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
  mountpoint -q "$root/dev/pts" || mount --bind /dev/pts "$root/dev/pts"
}

# debian_root_unmount ROOT [MORE...]: what debian_root_mount mounted, the
# mount the tests' network namespaces leave in run/netns, and MORE (paths
# under ROOT).
debian_root_unmount() {
  local root=$1
  shift
  local m
  for m in "$@" run/netns dev/pts dev proc sys; do
    umount -l "$root/$m" 2>/dev/null || true
  done
  # Whatever is still mounted below ROOT (a root made inside it, as
  # scripts/torch2.sh makes one in scripts/fresh_machine.sh's), deepest
  # first: nothing of the host may stay reachable from ROOT once it goes.
  for m in $(findmnt -rn -o TARGET | sort -r); do
    if [[ $m == "$root"/* ]]; then
      umount -l "$m" 2>/dev/null || true
    fi
  done
}

# debian_root_run ROOT COMMAND: COMMAND (a bash command line) in ROOT, with
# a clean environment as a login would have it.
debian_root_run() {
  chroot "$1" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "$2"
}
