#!/usr/bin/env bash
# Builds the debian:12 (bookworm) image as a root filesystem tarball:
#   scripts/build-debian-image.sh OUT.tar
# debootstrap (minbase + the tools listed in `packages` below, python3 with
# its standard library byte-compiled) from the mirror in this machine's apt
# sources (override with DEBIAN_MIRROR=URL). docs/operations.md ("The bundled
# debian:12 image") says what is in it. Takes about 3 minutes,
# so the result is cached: nothing is done when OUT.tar exists and is newer
# than this script. Import it into the node's image store (`warren image
# import OUT.tar --name debian:12 --data-dir /var/lib/warren`, as `make
# debian-image` does), or without --data-dir upload it to a running server
# through the API. Needs root.
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

# What an agent reaches for: a shell, python3 with venv, git, curl (with CA
# certificates), ps/top/kill (procps), less, patch, diff/cmp (diffutils),
# xz and the usual archive tools.
packages=bash,coreutils,python3,python3-venv,git,curl,ca-certificates,procps,less,patch,diffutils,xz-utils,bzip2,unzip

echo "debootstrap bookworm from $mirror"
start=$SECONDS
debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}

# Caches, logs and host leftovers do not belong in an image.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/cache/apt/archives/partial/* "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
  "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/* "$root"/run/* "$root"/dev/* "$root"/proc/* "$root"/sys/*
# Byte-code: whatever the package scripts left (compiled at install time in
# an unknown order) goes, and every module of the standard library and of
# the Debian Python packages is compiled afresh, so no sandbox compiles it on
# first use (600 ms for the first `python3 -m unittest` at 0.5 CPU) or
# writes __pycache__ into its writable layer. The .pyc files check the
# source's mtime and size, which the tarball, the image store (EROFS with
# --preserve-mtime) and the overlay keep.
find "$root" -name '__pycache__' -prune -exec rm -rf {} +
py=$(chroot "$root" python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
# (Files written to fail, such as lib2to3's test data, are skipped.)
chroot "$root" python3 -m compileall -q -x '/lib2to3/tests/data/' "/usr/lib/$py" /usr/lib/python3/dist-packages \
  >"$work/compileall.log" 2>&1 || {
  echo "compileall failed:" >&2
  tail -n 20 "$work/compileall.log" >&2
  exit 1
}
: >"$root/etc/resolv.conf"
echo sandbox >"$root/etc/hostname"
rm -f "$root/etc/machine-id"
: >"$root/etc/machine-id"

tar --numeric-owner --xattrs --xattrs-include='*' --sort=name -C "$root" -cf "$work/out.tar" .
mv "$work/out.tar" "$out"
echo "built $out ($(du -h "$out" | cut -f1)) in $((SECONDS - start)) s"
