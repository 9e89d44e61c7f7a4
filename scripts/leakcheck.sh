#!/usr/bin/env bash
# Fails when warren left a mount, cgroup, network namespace, veth, nftables
# table, loop device or process on the host (tests use data dirs under the temp dir).
leaks=0
if grep -E 'warren|wtest' /proc/self/mountinfo; then echo "LEAK: mounts"; leaks=1; fi
for c in /sys/fs/cgroup/*/warren* /sys/fs/cgroup/*/*/warren*; do
  [ -e "$c" ] || continue
  echo "LEAK: cgroup $c"; leaks=1
  if find "$c" -mindepth 1 -type d | grep -q .; then echo "LEAK: cgroups under $c"; find "$c" -mindepth 1 -type d | head; leaks=1; fi
done
if ip netns list 2>/dev/null | grep -q warren; then echo "LEAK: netns"; leaks=1; fi
# Networked sandboxes: host ends of their veths (wn + 12 hex digits, alias
# "<owner> <sandbox id>") and their edge's nftables table (warren_<owner>).
if ip -o link show 2>/dev/null | grep -E '^[0-9]+: wn[0-9a-f]{12}[@:]'; then echo "LEAK: veth"; leaks=1; fi
if command -v nft >/dev/null && nft list tables 2>/dev/null | grep -E 'inet warren_'; then echo "LEAK: nftables tables"; leaks=1; fi
if losetup -a 2>/dev/null | grep -E 'warren|scratch'; then echo "LEAK: loop devices"; leaks=1; fi
# A zombie does not count: an agent orphaned by a test's kill -9 of its edge
# waits for the host's init to reap it.
live_agents() {
  local p
  for p in $(pgrep -f 'warren-agent'); do
    [[ $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1) == Z ]] || echo "$p"
  done
}
if [[ -n $(live_agents) ]]; then echo "LEAK: processes"; ps -o pid,stat,args -p "$(live_agents | paste -sd,)" | head; leaks=1; fi
# microVMs (internal/runtime/microvm): QEMU named warren-vm:<sandbox id>.
if pgrep -f 'qemu-system.*warren-vm:' >/dev/null; then echo "LEAK: qemu processes"; pgrep -af 'qemu-system.*warren-vm:' | cut -c1-200 | head; leaks=1; fi
[ $leaks = 0 ] && echo "no leaks"
exit $leaks
