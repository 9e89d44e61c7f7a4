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
  xz-utils lz4     # unpack the guest kernel's payload (xz: Debian's generic kernel, lz4: its cloud kernel)
  qemu-utils       # qemu-img: the vm tier's disk images (import validation, per-sandbox overlays)
  fdisk            # sfdisk: the partition table of the vm tier's test disk (scripts/vm-disk.sh)
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

# The official e2b SDK (npm), at the version test/e2b-sdk/package.json pins
# (package-lock.json fixes every dependency), into test/e2b-sdk/node_modules
# (ignored by git): the E2B compatibility tests and `warren bench --figures
# e2b` drive warren with it. Needs node >= 20.18 and npm.
e2b_dir="$(cd "$(dirname "$0")/.." && pwd)/test/e2b-sdk"
e2b_want="$(sed -n 's/.*"e2b": *"\([^"]*\)".*/\1/p' "$e2b_dir/package.json")"
e2b_have="$(sed -n 's/^  "version": *"\([^"]*\)".*/\1/p' "$e2b_dir/node_modules/e2b/package.json" 2>/dev/null || true)"
if [[ "$e2b_have" != "$e2b_want" ]]; then
  if command -v npm >/dev/null; then
    echo "installing the e2b SDK $e2b_want into test/e2b-sdk"
    (cd "$e2b_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  else
    echo "warning: npm is missing; the E2B SDK tests need node >= 20.18 and npm" >&2
  fi
fi
