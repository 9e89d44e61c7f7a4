#!/usr/bin/env bash
# Fetches the guest kernel of the microvm tier (internal/runtime/microvm) from
# the Debian mirror in the machine's apt sources and unpacks what the tier
# needs into OUT/<version>/:
#   vmlinux      the uncompressed kernel (QEMU's microvm machine boots an ELF)
#   modules/     the modules the guest loads, in load order (modules.order)
#   version      the kernel package's name and version
# and points OUT/current at it. Idempotent: a version already unpacked is
# kept, so it runs in well under a second once cached.
#
# Bring your own kernel: put a vmlinux (and the .ko files your kernel needs
# as modules, listed in modules.order; none if they are built in) in a
# directory and pass it to `warren serve --vm-kernel DIR`.
#
# usage: scripts/vm-kernel.sh OUT [PACKAGE]   (PACKAGE: default the one
# linux-image-cloud-amd64 depends on, else the one linux-image-amd64 does)
#
# Debian's cloud kernel is the default: it is built for virtual machines
# (fewer drivers built in), so a guest reserves less memory at boot and
# boots sooner (measured in docs/BENCHMARKS.md, "VM tiers, fourth session
# of 2026-12-02"). Any Debian amd64 kernel package works.
set -euo pipefail
out=${1:?usage: vm-kernel.sh OUT [PACKAGE]}
depends() { apt-cache depends "$1" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
pkg=${2:-$(depends linux-image-cloud-amd64)}
pkg=${pkg:-$(depends linux-image-amd64)}
if [[ -z "$pkg" ]]; then
  echo "vm-kernel: no linux-image package in the apt sources (run apt-get update)" >&2
  exit 1
fi
pkgver=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
dest="$out/$pkg"

# The modules the guest loads, dependencies first. virtio itself is modular
# in Debian's kernel (virtio_mmio for the microvm machine, virtio_pci for
# the vm tier's q35); ext4 (the writable disk), erofs (layers) and overlay
# assemble the root; virtio_net (with failover, net_failover) is a networked
# VM's interface. One that the kernel has built in (modules.builtin) is
# left out of modules.order; wanted records the list asked for.
mods=(virtio_ring virtio virtio_mmio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
      virtio_blk virtio_console virtio_balloon failover net_failover virtio_net
      crc32c_generic libcrc32c crc16 mbcache jbd2 ext4 erofs overlay)
# A version already unpacked with every module is kept.
if [[ -s "$dest/vmlinux" && "$(cat "$dest/version" 2>/dev/null)" == "$pkg $pkgver" &&
      "$(cat "$dest/wanted" 2>/dev/null)" == "$(printf '%s\n' "${mods[@]}")" ]]; then
  ln -sfn "$pkg" "$out/current"
  exit 0
fi

work=$(mktemp -d "$out/.fetch.XXXXXX" 2>/dev/null || { mkdir -p "$out"; mktemp -d "$out/.fetch.XXXXXX"; })
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q "$pkg" >/dev/null 2>&1) || {
  echo "vm-kernel: apt-get download $pkg failed" >&2
  exit 1
}
dpkg-deb -x "$work"/*.deb "$work/x"
kver=$(ls "$work/x/lib/modules")
vmlinuz="$work/x/boot/vmlinuz-$kver"

# The bzImage's payload is xz (the generic kernel) or lz4 in its legacy
# frame (the cloud kernel): find the magic and decompress from there (the
# decompressor reports trailing garbage after the stream; the ELF is whole).
payload() { LC_ALL=C grep -obUaP "$1" "$vmlinuz" | head -1 | cut -d: -f1 || true; }
if off=$(payload '\xfd7zXZ\x00') && [[ -n "$off" ]]; then
  tail -c +"$((off + 1))" "$vmlinuz" | xz -dc >"$work/vmlinux" 2>/dev/null || true
elif off=$(payload '\x02\x21\x4c\x18') && [[ -n "$off" ]]; then
  tail -c +"$((off + 1))" "$vmlinuz" | lz4 -dc >"$work/vmlinux" 2>/dev/null || true
else
  echo "vm-kernel: no xz or lz4 payload in $vmlinuz" >&2
  exit 1
fi
if [[ "$(head -c 4 "$work/vmlinux" | od -An -c | tr -d ' ')" != '177ELF' ]]; then
  echo "vm-kernel: the payload of $vmlinuz is not an ELF kernel" >&2
  exit 1
fi

mkdir -p "$work/out/modules"
mv "$work/vmlinux" "$work/out/vmlinux"
: >"$work/out/modules/modules.order"
for m in "${mods[@]}"; do
  f=$(find "$work/x/lib/modules/$kver" -name "$m.ko" | head -1)
  if [[ -z "$f" ]]; then
    if grep -q "/$m.ko\$" "$work/x/lib/modules/$kver/modules.builtin" 2>/dev/null; then
      continue # built in
    fi
    echo "vm-kernel: module $m not in $pkg" >&2
    exit 1
  fi
  cp "$f" "$work/out/modules/$m.ko"
  echo "$m.ko" >>"$work/out/modules/modules.order"
done
echo "$pkg $pkgver" >"$work/out/version"
printf '%s\n' "${mods[@]}" >"$work/out/wanted"
rm -rf "$dest"
mv "$work/out" "$dest"
ln -sfn "$pkg" "$out/current"
echo "vm-kernel: $pkg $pkgver in $dest"
