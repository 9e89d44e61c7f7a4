package hoststat

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SharedLimits are host sysctls that bound a per-user count which every
// sandbox's root shares with the host's root (sandboxes run as uid 0 of the
// host's user namespace): with the defaults, 128 sandboxes that each run one
// `tail -f` use up every inotify instance of uid 0, the host's daemons'
// included. The kernel charges inotify instances and watches to the memory
// cgroup of their creator, so once these are high a sandbox's memory limit
// is what bounds it.
var SharedLimits = map[string]int64{
	"fs/inotify/max_user_instances": 1 << 20,
	"fs/inotify/max_user_watches":   1 << 22,
}

// RaiseSharedLimits raises each of SharedLimits under sysctlDir (normally
// /proc/sys) to its value when it is lower; it never lowers one. It
// returns what it changed, as "name: old → new".
func RaiseSharedLimits(sysctlDir string) ([]string, error) {
	var changed []string
	for name, want := range SharedLimits {
		p := filepath.Join(sysctlDir, name)
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			continue // a kernel without the feature
		}
		if err != nil {
			return changed, err
		}
		have, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return changed, fmt.Errorf("hoststat: %s: %w", p, err)
		}
		if have >= want {
			continue
		}
		if err := os.WriteFile(p, []byte(strconv.FormatInt(want, 10)), 0); err != nil {
			return changed, fmt.Errorf("hoststat: raise %s to %d: %w", strings.ReplaceAll(name, "/", "."), want, err)
		}
		changed = append(changed, fmt.Sprintf("%s: %d → %d", strings.ReplaceAll(name, "/", "."), have, want))
	}
	return changed, nil
}
