#!/usr/bin/env bash
# Builds the debian:12 (bookworm) image as a root filesystem tarball:
#   scripts/build-debian-image.sh OUT.tar
# debootstrap (minbase + bash, coreutils, python3) from the mirror in this
# machine's apt sources (override with DEBIAN_MIRROR=URL). Takes about 70 s,
# so the result is cached: nothing is done when OUT.tar exists and is newer
# than this script. Import it into the image store (`warren image import
# OUT.tar --name debian:12`, as `make debian-image` does). Needs root.
set -euo pipefail

out=${1:?usage: $0 OUT.tar}
script=$(readlink -f "$0")
if [[ -f $out && $out -nt $script ]]; then
  echo "up to date: $out"
  exit 0
fi

# find_mirror prints the URI of the first apt source that serves bookworm
# itself (not bookworm-security or -updates only).
find_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk 'BEGIN { RS = "" }
      /(^|\n)Types:[^\n]*deb([ \t]|\n|$)/ && /(^|\n)Suites:([^\n]*[ \t])?bookworm([ \t]|\n|$)/ {
        if (match($0, /URIs:[ \t]*[^ \t\n]+/)) {
          s = substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", s); print s; exit
        }
      }' "$f"
  done
  local l
  for l in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $l ]] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -E 's/\[[^]]*\]//' "$l" | awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }'
  done
}

mirror=${DEBIAN_MIRROR:-$(find_mirror | head -n 1)}
if [[ -z $mirror ]]; then
  echo "no bookworm mirror in /etc/apt/sources.list{,.d}; set DEBIAN_MIRROR" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing (scripts/install-deps.sh)" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
work=$(mktemp -d "$(dirname "$out")/.debian-image.XXXXXX")
root=$work/root

cleanup() {
  # debootstrap mounts proc/sys inside the root and may leave them on failure.
  local m
  for m in $(awk -v r="$root" 'index($5, r) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

echo "debootstrap bookworm from $mirror"
start=$SECONDS
debootstrap --variant=minbase --include=bash,coreutils,python3 bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}

# Caches, logs and host leftovers do not belong in an image.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/cache/apt/archives/partial/* "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
  "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/* "$root"/run/* "$root"/dev/* "$root"/proc/* "$root"/sys/*
find "$root" -name '__pycache__' -prune -exec rm -rf {} +
: >"$root/etc/resolv.conf"
echo sandbox >"$root/etc/hostname"
rm -f "$root/etc/machine-id"
: >"$root/etc/machine-id"

tar --numeric-owner --xattrs --xattrs-include='*' --sort=name -C "$root" -cf "$work/out.tar" .
mv "$work/out.tar" "$out"
echo "built $out ($(du -h "$out" | cut -f1)) in $((SECONDS - start)) s"
