// Package sandboxspec validates create requests and fills in defaults. The
// apiserver checks before placing; the edge checks again before admitting.
package sandboxspec

import (
	"fmt"
	"github.com/warrenhq/warren/internal/auditpolicy"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
)

// Defaults and bounds.
const (
	DefaultCPU      = 1.0
	DefaultMemoryMB = 512
	DefaultDiskMB   = 1024
	DefaultPids     = 1024
	DefaultTTL      = 3600 // seconds
	// DefaultIdleCPU is the CPU, in cores, a sandbox gets between
	// operations unless it asks for another budget or always_on.
	DefaultIdleCPU = 0.05

	MaxCPU         = 256
	MaxMemoryMB    = 1 << 20 // 1 TiB
	MaxDiskMB      = 1 << 22 // 4 TiB
	MaxPids        = 1 << 22
	MaxTTL         = 30 * 24 * 3600
	MaxEnv         = 256
	MaxLabels      = 64
	MaxValueLength = 4096
	MaxLayers      = 32 // named layers per sandbox
)

var (
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	userRE     = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$|^[0-9]{1,10}(:[0-9]{1,10})?$`)
	imageRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$`)
	snapshotRE = regexp.MustCompile(`^snap-[a-z0-9]{1,40}$`)
	trajRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/~:-]{0,199}$`)
	checkRE    = regexp.MustCompile(`^[1-9][0-9]{0,5}$`)
)

// ValidSnapshotID reports whether id can name a snapshot.
func ValidSnapshotID(id string) bool { return snapshotRE.MatchString(id) }

// ValidTrajectory reports whether name can name a trajectory.
func ValidTrajectory(name string) bool {
	return trajRE.MatchString(name) && !strings.Contains(name, "..")
}

// CheckpointEvery returns how many steps lie between checkpoints (0 = none).
func CheckpointEvery(c string) int {
	switch c {
	case "", "none":
		return 0
	case "every-step":
		return 1
	}
	n := 0
	fmt.Sscanf(c, "%d", &n)
	return n
}

// CheckResume validates a resume request (which creates nothing).
func CheckResume(req *api.CreateSandboxRequest) *api.Error {
	return checkHistory(req)
}

// checkHistory validates snapshot and trajectory fields.
func checkHistory(req *api.CreateSandboxRequest) *api.Error {
	if req.Snapshot != "" {
		if !snapshotRE.MatchString(req.Snapshot) {
			return invalid("snapshot %q is malformed", truncate(req.Snapshot))
		}
		if req.Image != "" || len(req.Layers) > 0 {
			return invalid("a sandbox restored from a snapshot takes its image and layers from it")
		}
	}
	if req.Trajectory != "" && !ValidTrajectory(req.Trajectory) {
		return invalid("trajectory %q is malformed (letters, digits, . _ / ~ : -, at most 200)", truncate(req.Trajectory))
	}
	if (req.Resume || req.Branch || req.Checkpoint != "" || req.TrajectoryTTL != 0) && req.Trajectory == "" {
		return invalid("resume, branch, checkpoint and trajectory_ttl need a trajectory")
	}
	if req.TrajectoryTTL < 0 || req.TrajectoryTTL > 10*365*86400 {
		return invalid("trajectory_ttl must be between 0 (kept until deleted) and %d seconds", 10*365*86400)
	}
	switch {
	case req.Checkpoint == "", req.Checkpoint == "none", req.Checkpoint == "every-step", checkRE.MatchString(req.Checkpoint):
	default:
		return invalid("checkpoint must be \"none\", \"every-step\" or a number of steps")
	}
	return nil
}

func invalid(format string, a ...any) *api.Error {
	return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(format, a...)}
}

// DefaultHostname is the hostname of a sandbox whose create names none.
const DefaultHostname = "sandbox"

// Normalize validates req and fills in defaults in place.
func Normalize(req *api.CreateSandboxRequest) *api.Error {
	if req.Tier == "" {
		req.Tier = api.TierContainer
	}
	if !slices.Contains(api.Tiers, req.Tier) {
		// A request naming no tier the API has is a bad request (400),
		// as an unknown route is; a known tier no node offers is the
		// placement's 503.
		return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("tier %q is unknown (tiers: %s)", truncate(req.Tier), strings.Join(api.Tiers, ", "))}
	}
	if aerr := checkMicroVM(req); aerr != nil {
		return aerr
	}
	if aerr := checkHistory(req); aerr != nil {
		return aerr
	}
	switch {
	case req.Image == "" && req.Snapshot != "":
		// The edge fills image and layers from the snapshot.
	case req.Image == "":
		return invalid("image is required")
	case !imageRE.MatchString(req.Image) || strings.Contains(req.Image, ".."):
		return invalid("image name %q is malformed", truncate(req.Image))
	}
	if aerr := normalizeResources(req); aerr != nil {
		return aerr
	}
	if aerr := normalizeModes(req); aerr != nil {
		return aerr
	}
	if aerr := foldNetworkRules(req); aerr != nil {
		return aerr
	}
	if aerr := CheckNetwork(req.Network); aerr != nil {
		return aerr
	}
	if _, err := auditpolicy.Compile(req.Audit); err != nil {
		return invalid("%v", err)
	}
	if len(req.Env) > MaxEnv {
		return invalid("at most %d env variables", MaxEnv)
	}
	if err := CheckEnv(req.Env); err != nil {
		return err
	}
	if len(req.Labels) > MaxLabels {
		return invalid("at most %d labels", MaxLabels)
	}
	if aerr := checkLabelMap(req.Labels, "label key", "label"); aerr != nil {
		return aerr
	}
	if len(req.NodeSelector) > MaxLabels {
		return invalid("at most %d node_selector entries", MaxLabels)
	}
	if aerr := checkLabelMap(req.NodeSelector, "node_selector key", "node_selector"); aerr != nil {
		return aerr
	}
	if aerr := normalizeIdentity(req); aerr != nil {
		return aerr
	}
	return checkLayers(req.Layers)
}

// normalizeResources checks req's cpu, idle_cpu, memory_mb, disk_mb, pids,
// ttl and idle_timeout, and fills in the defaults of those left out.
func normalizeResources(req *api.CreateSandboxRequest) *api.Error {
	switch {
	case req.CPU == 0:
		req.CPU = DefaultCPU
	case req.CPU < 0.01 || req.CPU > MaxCPU || req.CPU != req.CPU:
		return invalid("cpu must be between 0.01 and %d cores", MaxCPU)
	}
	switch {
	case req.IdleCPU == nil:
		v := min(DefaultIdleCPU, req.CPU)
		req.IdleCPU = &v
	case *req.IdleCPU < 0 || *req.IdleCPU > req.CPU || *req.IdleCPU != *req.IdleCPU:
		return invalid("idle_cpu must be between 0 and cpu (%g cores)", req.CPU)
	}
	for _, f := range []struct {
		v             *int64
		name, unit    string
		def, min, max int64
	}{
		{&req.MemoryMB, "memory_mb", "", DefaultMemoryMB, 16, MaxMemoryMB},
		{&req.DiskMB, "disk_mb", "", DefaultDiskMB, 1, MaxDiskMB},
		{&req.Pids, "pids", "", DefaultPids, 8, MaxPids},
		{&req.TTL, "ttl", " seconds", DefaultTTL, 1, MaxTTL},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < f.min || *f.v > f.max:
			return invalid("%s must be between %d and %d%s", f.name, f.min, f.max, f.unit)
		}
	}
	if req.IdleTimeout < 0 || req.IdleTimeout > MaxTTL {
		return invalid("idle_timeout must be between 0 and %d seconds", MaxTTL)
	}
	return nil
}

// normalizeModes checks req's priority and idle_timeout_action, and fills
// in their defaults (best effort; stop).
func normalizeModes(req *api.CreateSandboxRequest) *api.Error {
	switch req.Priority {
	case "":
		req.Priority = api.PriorityBestEffort
	case api.PriorityBestEffort, api.PriorityLatency:
	default:
		return invalid("priority %q is unknown (want %q or %q)", truncate(req.Priority), api.PriorityBestEffort, api.PriorityLatency)
	}
	switch req.IdleTimeoutAction {
	case "":
		req.IdleTimeoutAction = api.IdleActionStop
	case api.IdleActionStop, api.IdleActionPause:
	default:
		return invalid("idle_timeout_action %q is unknown (want %q or %q)", truncate(req.IdleTimeoutAction), api.IdleActionStop, api.IdleActionPause)
	}
	return nil
}

// checkLabelMap checks the keys and values of labels or a node selector;
// its errors name a key as keyWhat and a value as valueWhat.
func checkLabelMap(m map[string]string, keyWhat, valueWhat string) *api.Error {
	for k, v := range m {
		if !labelKeyRE.MatchString(k) {
			return invalid("%s %q is malformed", keyWhat, truncate(k))
		}
		if len(v) > 256 || !utf8.ValidString(v) || strings.ContainsAny(v, "\x00\n") {
			return invalid("%s %q has a malformed value", valueWhat, k)
		}
	}
	return nil
}

// normalizeIdentity checks req's project, user and hostname, and fills in
// the default hostname.
func normalizeIdentity(req *api.CreateSandboxRequest) *api.Error {
	if req.Project != "" && !ValidProject(req.Project) {
		return invalid("project %q is malformed (names of [a-z0-9-] joined by '.')", truncate(req.Project))
	}
	if req.User != "" && !userRE.MatchString(req.User) {
		return invalid("user %q is malformed", truncate(req.User))
	}
	if req.Hostname == "" {
		req.Hostname = DefaultHostname
	}
	if !hostnameRE.MatchString(req.Hostname) {
		return invalid("hostname %q is malformed", truncate(req.Hostname))
	}
	return nil
}

// reservedMounts are paths the sandbox's own /proc, /sys and /dev cover.
var reservedMounts = []string{"/proc", "/sys", "/dev"}

func checkLayers(ls []api.LayerAttachment) *api.Error {
	if len(ls) > MaxLayers {
		return invalid("at most %d layers", MaxLayers)
	}
	mounts := map[string]bool{}
	for i, l := range ls {
		if _, _, err := api.ParseLayerRef(l.Layer); err != nil {
			return invalid("layers[%d]: %s", i, strings.TrimPrefix(err.Error(), "invalid: "))
		}
		if l.Mount == "" {
			if l.Protected {
				return invalid("layers[%d]: protected needs a mount point", i)
			}
			continue
		}
		m := l.Mount
		if !strings.HasPrefix(m, "/") || path.Clean(m) != m || m == "/" || len(m) > 1024 ||
			strings.ContainsAny(m, ",:\x00\n") || !utf8.ValidString(m) {
			return invalid("layers[%d]: mount %q must be a clean absolute path other than /", i, truncate(m))
		}
		for _, r := range reservedMounts {
			if m == r || strings.HasPrefix(m, r+"/") {
				return invalid("layers[%d]: mount %q is inside %s", i, m, r)
			}
		}
		for other := range mounts {
			if m == other || strings.HasPrefix(m, other+"/") || strings.HasPrefix(other, m+"/") {
				return invalid("layers[%d]: mount %q overlaps %s", i, m, other)
			}
		}
		mounts[m] = true
	}
	return nil
}

// CheckEnv validates environment variables.
func CheckEnv(env map[string]string) *api.Error {
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return invalid("env name %q is malformed", truncate(k))
		}
		if len(v) > MaxValueLength*8 || strings.IndexByte(v, 0) >= 0 {
			return invalid("env %s has a malformed or oversized value", k)
		}
	}
	return nil
}

// CheckUser validates an exec user.
func CheckUser(u string) *api.Error {
	if u != "" && !userRE.MatchString(u) {
		return invalid("user %q is malformed", truncate(u))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// MaxProjectPath bounds the length of a project id (its nesting is
// otherwise unbounded).
const MaxProjectPath = 512

var projectNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// ValidProjectName reports whether name can name one level of a project.
func ValidProjectName(name string) bool { return projectNameRE.MatchString(name) }

// ValidProject reports whether id is a project id: names joined by '.',
// parent first ("acme.rl.run7").
func ValidProject(id string) bool {
	if id == "" || len(id) > MaxProjectPath {
		return false
	}
	for _, p := range strings.Split(id, ".") {
		if !ValidProjectName(p) {
			return false
		}
	}
	return true
}

// Within reports whether project is scope or one of its descendants ("" is
// the root: everything is within it).
func Within(project, scope string) bool {
	return scope == "" || project == scope || strings.HasPrefix(project, scope+".")
}

// foldNetworkRules adds the rules network_rules sets true to the egress
// list.
func foldNetworkRules(req *api.CreateSandboxRequest) *api.Error {
	if len(req.NetworkRules) == 0 {
		return nil
	}
	if len(req.NetworkRules) > api.MaxEgressRules {
		return invalid("network_rules: at most %d rules", api.MaxEgressRules)
	}
	var names []string
	for name, on := range req.NetworkRules {
		if !api.RuleNameRE.MatchString(name) {
			return invalid("network_rules: %q is not a rule name", truncate(name))
		}
		if on {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if req.Network == nil {
		req.Network = &api.NetworkSpec{}
	}
	for _, n := range names {
		if !slices.Contains(req.Network.Egress, n) {
			req.Network.Egress = append(req.Network.Egress, n)
		}
	}
	req.NetworkRules = nil
	return nil
}

// CheckNetwork validates the opt-in network (of a create, or of a change
// of a running sandbox's): every egress entry parses and there are at most
// api.MaxEgressRules. Entries are rewritten to their canonical form
// ("10.1.2.9/24" becomes "10.1.2.0/24").
func CheckNetwork(n *api.NetworkSpec) *api.Error {
	if n == nil {
		return nil
	}
	if len(n.Egress) > api.MaxEgressRules {
		return invalid("network.egress: at most %d entries", api.MaxEgressRules)
	}
	for i, e := range n.Egress {
		if len(e) > api.MaxHostLen+16 {
			return invalid("network.egress[%d] %q is too long", i, truncate(e))
		}
		r, err := api.ParseEgress(e)
		if err != nil {
			return invalid("network.%v", err)
		}
		n.Egress[i] = r.String()
	}
	if n.Egress == nil {
		n.Egress = []string{}
	}
	if n.Group != "" && !api.NetworkGroupRE.MatchString(n.Group) {
		return invalid("network.group %q: want 1-63 of a-z, 0-9 and -", truncate(n.Group))
	}
	if n.EgressRateMbit < 0 || n.EgressRateMbit > api.MaxEgressRateMbit {
		return invalid("network.egress_rate_mbit %d: want 0 (the node's default) to %d", n.EgressRateMbit, api.MaxEgressRateMbit)
	}
	if n.IngressRateMbit < 0 || n.IngressRateMbit > api.MaxEgressRateMbit {
		return invalid("network.ingress_rate_mbit %d: want 0 (the node's default) to %d", n.IngressRateMbit, api.MaxEgressRateMbit)
	}
	if n.MaxConns < 0 || n.MaxConns > api.MaxNetConns {
		return invalid("network.max_conns %d: want 0 (the node's default) to %d", n.MaxConns, api.MaxNetConns)
	}
	return nil
}

// MinMicroVMMemoryMB is the least memory a microVM boots with.
const MinMicroVMMemoryMB = 128

// checkMicroVM refuses what the microvm and vm tiers do not offer:
// protected layers, too little memory to boot; and a
// display anywhere but on the vm tier. (Snapshots and trajectories work:
// a snapshot's layers are a VM's disks, a checkpoint is a disk snapshot.)
func checkMicroVM(req *api.CreateSandboxRequest) *api.Error {
	if req.Display && req.Tier != api.TierVM {
		return invalid("display: true needs tier vm (tier %s has no screen)", req.Tier)
	}
	if req.Tier != api.TierMicroVM && req.Tier != api.TierVM {
		return nil
	}
	t := req.Tier
	if req.MemoryMB != 0 && req.MemoryMB < MinMicroVMMemoryMB {
		return invalid("tier %s: memory_mb must be at least %d", t, MinMicroVMMemoryMB)
	}
	for _, l := range req.Layers {
		if l.Protected {
			return invalid("tier %s: layer %s: protected layers are the container tier's (root in a VM's guest could replace one); attach it without protected", t, l.Layer)
		}
	}
	return nil
}
