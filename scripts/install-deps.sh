#!/usr/bin/env bash
# Installs the Debian packages warren needs to build, run and test. Idempotent:
# it only calls apt-get when a package is missing.
set -euo pipefail

packages=(
  busybox-static   # the default "busybox" image and in-sandbox shell for tests
  runc             # peer measured by `make bench`
  bubblewrap       # peer measured by `make bench`
  debootstrap      # builds the default debian:12 image
  xfsprogs         # per-sandbox disk quota (XFS project quota on the scratch filesystem)
  btrfs-progs      # per-sandbox disk quota where XFS quota is missing (mkfs.btrfs for btrfs qgroups)
  erofs-utils      # read-only layer images
  iproute2
  nftables         # the leak check lists leftover nftables tables of networked sandboxes
  python3          # Python SDK tests
  gcc libc6-dev    # cgo for the race detector (make test runs -race)
  python3-pip      # the docs test installs the SDK as a user would
  curl jq          # the docs test runs the shell examples of README and docs/
  qemu-system-x86  # the microvm tier (internal/runtime/microvm)
  kmod             # modinfo/depmod for the microvm tier's guest kernel (scripts/vm-kernel.sh)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
