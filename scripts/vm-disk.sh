#!/usr/bin/env bash
# Builds the vm tier's test disk image (internal/runtime/vm): Debian 12 with
# its own kernel, initramfs, GRUB and systemd, and warren-agent installed as
# a systemd service (warren-agent.service: `warren-agent --vm-service PORT`)
# that serves the agent protocol on the VM's virtio-serial port.
#
#   CACHE/rootfs-<key>/      debootstrap's tree (the slow part: 4–6 min on a
#                            loaded 2-core machine), key = its build steps,
#                            packages and mirror
#   CACHE/disk-<key2>.raw    the bootable disk: MBR, GRUB in the gap after
#                            it, one ext4 partition; key2 = key + this script
#                            + the agent (~20 s to re-pack)
#   CACHE/debian-12.raw      symlink to the newest disk
#
# Offline but for the Debian mirror of the machine's apt sources. Idempotent:
# once cached it runs in well under a second; a new agent only re-packs the
# disk (~20 s). Runs as root (debootstrap, chroot, mkfs.ext4 -d).
#
# usage: scripts/vm-disk.sh CACHE AGENT   (prints the disk's path)
set -euo pipefail

cache=${1:?usage: vm-disk.sh CACHE AGENT}
agent=${2:?usage: vm-disk.sh CACHE AGENT}
[[ -x "$agent" ]] || { echo "vm-disk: agent $agent is not an executable" >&2; exit 1; }
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
exec 9>"$cache/.lock"
flock 9
# Standard output is the disk's path alone; the tools' chatter goes to stderr.
exec 3>&1 1>&2

# The first deb.debian.org-style mirror of the apt sources (deb822 or one-line).
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
  awk '/^(URIs:|deb )/ { for (i = 1; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }' || true)
mirror=${mirror:-http://deb.debian.org/debian}

# What the image holds: its kernel, initramfs-tools, GRUB's BIOS images,
# systemd as init, udev (it loads the virtio modules), ps and kmod.
include=linux-image-amd64,initramfs-tools,grub-pc-bin,systemd-sysv,udev,procps,kmod,zstd

build_rootfs() {
  local tmp="$cache/.rootfs-$key.tmp"
  rm -rf "$tmp"
  echo "vm-disk: debootstrap bookworm from $mirror (a few minutes, once)" >&2
  debootstrap --variant=minbase --include="$include" bookworm "$tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    tail -20 "$cache/debootstrap.log" >&2
    echo "vm-disk: debootstrap failed (log: $cache/debootstrap.log)" >&2
    exit 1
  }
  # A small initramfs (the guest's disk driver and file system only):
  # GRUB reads it through the BIOS and the kernel unpacks it under TCG.
  cat >"$tmp/etc/initramfs-tools/conf.d/warren" <<'EOF'
MODULES=list
COMPRESS=zstd
EOF
  printf '%s\n' virtio_pci virtio_blk ext4 >>"$tmp/etc/initramfs-tools/modules"
  # Drivers a VM without such hardware never loads.
  local kdir
  kdir=$(ls -d "$tmp"/lib/modules/*)
  rm -rf "$kdir"/kernel/sound "$kdir"/kernel/drivers/{gpu,media,infiniband,staging,net/wireless,bluetooth,isdn,iio,hid,usb,scsi/qla2xxx,scsi/lpfc,scsi/mpt3sas,net/ethernet}
  chroot "$tmp" depmod "$(basename "$kdir")"
  # /proc for update-initramfs, unmounted whatever happens (also if this
  # script is interrupted) so that no mount outlives it.
  mount -t proc proc "$tmp/proc"
  trap 'umount "$tmp/proc" 2>/dev/null || true' EXIT INT TERM
  chroot "$tmp" update-initramfs -u -k all >>"$cache/debootstrap.log" 2>&1 || { echo "vm-disk: update-initramfs failed" >&2; exit 1; }
  umount "$tmp/proc"
  trap - EXIT INT TERM
  rm -rf "$tmp"/usr/share/{doc,man,info,locale} "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
  mv "$tmp" "$rootfs"
}

# The tree's key: what builds it (not the rest of this script).
key=$( (declare -f build_rootfs; echo "$include $mirror") | sha256sum | cut -c1-16)
rootfs="$cache/rootfs-$key"
if [[ ! -d "$rootfs" ]]; then
  build_rootfs
  # Older trees of this cache: replaced by this one.
  for d in "$cache"/rootfs-*; do [[ "$d" == "$rootfs" ]] || rm -rf "$d"; done
fi

key2=$(cat <(echo "$key") "$0" "$agent" | sha256sum | cut -c1-16)
disk="$cache/disk-$key2.raw"
if [[ -s "$disk" ]]; then
  ln -sfn "$(basename "$disk")" "$cache/debian-12.raw"
  echo "$cache/debian-12.raw" >&3
  exit 0
fi

work=$(mktemp -d "$cache/.disk.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree="$work/tree"
# A copy of the tree (hard links: mkfs.ext4 -d only reads it) with the
# files of this disk added.
cp -al "$rootfs" "$tree"
# (Files that differ from the tree's are removed first: they are links.)
rm -f "$tree/etc/hostname" "$tree/etc/machine-id" "$tree/var/lib/dbus/machine-id" "$tree/etc/fstab"
: >"$tree/etc/machine-id" # systemd makes one at the first boot
echo debian >"$tree/etc/hostname"
cat >"$tree/etc/fstab" <<'EOF'
/dev/vda1 / ext4 rw,errors=remount-ro 0 1
EOF
install -m 0755 "$agent" "$tree/usr/local/sbin/warren-agent.new"
mv "$tree/usr/local/sbin/warren-agent.new" "$tree/usr/local/sbin/warren-agent"
cat >"$tree/etc/systemd/system/warren-agent.service" <<'EOF'
[Unit]
Description=warren agent (serves the host on the virtio-serial port warren.agent)
# As early as the root is writable (the kernel mounts it so): a create
# returns when the agent answers; systemd goes on booting meanwhile.
DefaultDependencies=no
After=systemd-remount-fs.service

[Service]
ExecStartPre=-/sbin/modprobe virtio_console
ExecStartPre=-/sbin/modprobe virtio_net
ExecStart=/usr/local/sbin/warren-agent --vm-service warren.agent
# Its commands live in its cgroup; it opened the port exclusively and
# removed its node, so a restarted agent could not serve again anyway.
Restart=no
KillMode=mixed
OOMScoreAdjust=-1000

[Install]
WantedBy=sysinit.target
EOF
ln -sf /etc/systemd/system/warren-agent.service "$tree/etc/systemd/system/sysinit.target.wants/warren-agent.service"
# Nothing of a headless VM (its agent configures its network) waits for these.
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
  systemd-networkd-wait-online.service getty@tty1.service getty-static.service; do
  ln -sf /dev/null "$tree/etc/systemd/system/$u"
done

kver=$(ls "$tree/lib/modules")
mkdir -p "$tree/boot/grub"
cat >"$tree/boot/grub/grub.cfg" <<EOF
serial --unit=0 --speed=115200
terminal_input serial
terminal_output serial
set timeout=0
menuentry debian {
  linux /boot/vmlinuz-$kver root=/dev/vda1 rw console=ttyS0 quiet loglevel=3 panic=-1 tsc_early_khz=2000000 cryptomgr.notests systemd.show_status=0
  initrd /boot/initrd.img-$kver
}
EOF

# The disk: 2 GiB sparse, an MBR with one partition from 1 MiB, GRUB's
# boot sector in the MBR and its core image in the gap before the partition.
size_mb=2048
part="$work/part.ext4"
truncate -s $((size_mb - 1))M "$part"
mkfs.ext4 -q -F -L root -d "$tree" -E root_owner=0:0 "$part"
truncate -s "${size_mb}M" "$work/disk.raw"
echo 'start=2048, type=83, bootable' | sfdisk -q "$work/disk.raw"
dd if="$part" of="$work/disk.raw" bs=1M seek=1 conv=notrunc,sparse status=none
chroot "$tree" grub-mkimage -O i386-pc -o /tmp/core.img -p '(hd0,msdos1)/boot/grub' \
  biosdisk part_msdos ext2 normal linux serial terminal configfile echo
core="$tree/tmp/core.img"
if (($(stat -c %s "$core") > 2047 * 512)); then
  echo "vm-disk: GRUB's core image does not fit before the partition" >&2
  exit 1
fi
dd if="$tree/usr/lib/grub/i386-pc/boot.img" of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$core" of="$work/disk.raw" bs=512 seek=1 conv=notrunc status=none
mv "$work/disk.raw" "$disk"
for d in "$cache"/disk-*.raw; do [[ "$d" == "$disk" ]] || rm -f "$d"; done
ln -sfn "$(basename "$disk")" "$cache/debian-12.raw"
echo "$cache/debian-12.raw" >&3
