#!/bin/sh
# Sets up (and tears down) a swap file, so that pausing a sandbox can push
# its memory out. Swap is the operator's business in production (a swap
# file, a partition or zram); tests and benchmarks use this script.
#
#   scripts/swap.sh up [SIZE_MB]   # default 4096; counts a user when the file is already on
#   scripts/swap.sh down           # drops a user; the last one turns it off and deletes the file
#   scripts/swap.sh down --force   # off now, whatever the count
#   scripts/swap.sh status
#
# Concurrent test processes share the file: up/down keep a user count
# (under flock) so one test's teardown never pulls swap from another.
#
# WARREN_SWAPFILE overrides the file (default /var/tmp/warren-test.swap).
# The file must be on a filesystem that supports swap files (ext4, xfs; on
# btrfs it must be NOCOW): a tmpfs or overlay will not do.
set -eu
FILE=${WARREN_SWAPFILE:-/var/tmp/warren-test.swap}

COUNT="$FILE.users"

active() { swapon --show=NAME --noheadings 2>/dev/null | grep -qx "$FILE"; }
users() { cat "$COUNT" 2>/dev/null || echo 0; }

exec 9>"$FILE.lock"
flock 9

case "${1:-status}" in
up)
	SIZE=${2:-4096}
	if active; then
		echo $(($(users) + 1)) >"$COUNT"
		echo "swap: $FILE already on ($(users) users)"
		exit 0
	fi
	rm -f "$FILE"
	if ! fallocate -l "${SIZE}M" "$FILE" 2>/dev/null; then
		dd if=/dev/zero of="$FILE" bs=1M count="$SIZE" status=none
	fi
	chmod 600 "$FILE"
	mkswap "$FILE" >/dev/null
	if ! swapon "$FILE"; then
		rm -f "$FILE"
		echo "swap: swapon $FILE failed" >&2
		exit 1
	fi
	echo 1 >"$COUNT"
	echo "swap: $FILE on (${SIZE} MiB)"
	;;
down)
	n=$(($(users) - 1))
	if [ "${2:-}" != "--force" ] && [ "$n" -gt 0 ] && active; then
		echo "$n" >"$COUNT"
		echo "swap: $FILE stays on ($n users)"
		exit 0
	fi
	if active; then
		swapoff "$FILE"
	fi
	rm -f "$FILE" "$COUNT"
	echo "swap: $FILE off"
	;;
status)
	if active; then echo "on: $FILE"; else echo "off: $FILE"; fi
	swapon --show
	;;
*)
	echo "usage: $0 up [SIZE_MB] | down | status" >&2
	exit 2
	;;
esac
