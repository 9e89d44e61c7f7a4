#!/usr/bin/env bash
# Fails when warren left a mount, cgroup, network namespace, loop device or
# process on the host (tests use data dirs under the temp dir).
leaks=0
if grep -E 'warren|wtest' /proc/self/mountinfo; then echo "LEAK: mounts"; leaks=1; fi
for c in /sys/fs/cgroup/*/warren* /sys/fs/cgroup/*/*/warren*; do
  [ -e "$c" ] || continue
  echo "LEAK: cgroup $c"; leaks=1
  if find "$c" -mindepth 1 -type d | grep -q .; then echo "LEAK: cgroups under $c"; find "$c" -mindepth 1 -type d | head; leaks=1; fi
done
if ip netns list 2>/dev/null | grep -q warren; then echo "LEAK: netns"; leaks=1; fi
if losetup -a 2>/dev/null | grep -E 'warren|scratch'; then echo "LEAK: loop devices"; leaks=1; fi
if pgrep -f 'warren-agent' >/dev/null; then echo "LEAK: processes"; pgrep -af warren-agent | head; leaks=1; fi
[ $leaks = 0 ] && echo "no leaks"
exit $leaks
