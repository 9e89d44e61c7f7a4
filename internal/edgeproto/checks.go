package edgeproto

import (
	"fmt"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Checks the apiserver makes before it routes a request and the edge makes
// again before it acts.

// MaxLayerUpload bounds one uploaded layer tarball.
const MaxLayerUpload = 64 << 30

// MaxPoolSize bounds one pool on one node.
const MaxPoolSize = 10000

var poolNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$`)

// FnCallDirs are a stateless sandbox's writable directories.
var FnCallDirs = []string{"/tmp", "/var/tmp", "/root", "/home", "/run", "/work"}

// FnCall limits.
const (
	FnCallMaxTimeout   = 600 * time.Second
	FnCallMaxOutput    = 16 << 20
	FnCallMaxFiles     = 256
	FnCallMaxFileBytes = 768 << 10 // all files together (they travel in one bus message)
)

// NormalizeFnCall validates a task and fills in defaults; it returns the
// sandbox shape its worker has.
func NormalizeFnCall(c *api.FnCallRequest) (api.CreateSandboxRequest, *api.Error) {
	if c.Tier != "" && c.Tier != api.TierFnCall {
		return api.CreateSandboxRequest{}, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("tier %q: /v1/fncall runs the fncall tier", truncateName(c.Tier))}
	}
	if c.Image == "" {
		c.Image = "busybox"
	}
	spec := api.CreateSandboxRequest{Image: c.Image, CPU: c.CPU, MemoryMB: c.MemoryMB, Priority: api.PriorityLatency}
	if aerr := sandboxspec.Normalize(&spec); aerr != nil {
		return spec, aerr
	}
	if (c.Cmd == "") == (len(c.Argv) == 0) {
		return spec, &api.Error{Code: api.CodeInvalid, Message: "exactly one of cmd and argv is required"}
	}
	if aerr := sandboxspec.CheckEnv(c.Env); aerr != nil {
		return spec, aerr
	}
	if c.Timeout < 0 || c.Timeout > FnCallMaxTimeout.Seconds() || c.Timeout != c.Timeout {
		return spec, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("timeout must be between 0 and %.0f seconds", FnCallMaxTimeout.Seconds())}
	}
	if c.OutputCap < 0 || c.OutputCap > FnCallMaxOutput {
		return spec, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("output_cap must be between 0 and %d", FnCallMaxOutput)}
	}
	if c.Cwd == "" {
		c.Cwd = "/work"
	}
	if len(c.Files) > FnCallMaxFiles {
		return spec, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("at most %d files", FnCallMaxFiles)}
	}
	total := len(c.Stdin)
	for p, b := range c.Files {
		total += len(b)
		if !writablePath(p) {
			return spec, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("file %q must be a clean absolute path under one of %s", truncateName(p), strings.Join(FnCallDirs, ", "))}
		}
	}
	if total > FnCallMaxFileBytes {
		return spec, &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("files and stdin exceed %d bytes", FnCallMaxFileBytes)}
	}
	return spec, nil
}

func writablePath(p string) bool {
	if !path.IsAbs(p) || path.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return false
	}
	for _, d := range FnCallDirs {
		if strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// PoolSpec turns a pool request into the create request its members are
// made with, validated and normalized.
func PoolSpec(r *api.PoolRequest) (api.CreateSandboxRequest, *api.Error) {
	spec := api.CreateSandboxRequest{Tier: r.Tier, Image: r.Image, CPU: r.CPU, MemoryMB: r.MemoryMB,
		DiskMB: r.DiskMB, Pids: r.Pids, Priority: r.Priority}
	if aerr := sandboxspec.Normalize(&spec); aerr != nil {
		return spec, aerr
	}
	if r.Name != "" && !poolNameRE.MatchString(r.Name) {
		return spec, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("pool name %q is malformed (want [a-z0-9-], at most 48)", truncateName(r.Name))}
	}
	if r.Size < 0 || r.Size > MaxPoolSize {
		return spec, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("size must be between 0 and %d", MaxPoolSize)}
	}
	return spec, nil
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// SameOp reports whether a re-issued operation equals the logged one
// (timeouts and output caps are not compared).
func SameOp(a, b *api.TrajectoryStep) bool {
	if a.Op != b.Op || a.Path != b.Path || a.To != b.To || a.Mode != b.Mode || a.Recursive != b.Recursive ||
		a.Parents != b.Parents || a.Append != b.Append || a.DataHash != b.DataHash || a.StdinHash != b.StdinHash ||
		!slices.Equal(a.Egress, b.Egress) {
		return false
	}
	if (a.Exec == nil) != (b.Exec == nil) {
		return false
	}
	if a.Exec == nil {
		return true
	}
	x, y := *a.Exec, *b.Exec
	x.Timeout, y.Timeout, x.OutputCap, y.OutputCap = 0, 0, 0, 0
	if len(x.Env) == 0 {
		x.Env = nil
	}
	if len(y.Env) == 0 {
		y.Env = nil
	}
	return reflect.DeepEqual(x, y)
}

// ReplayFilter is what a replay leaves out of its comparison: matches of
// the masks in stdout and stderr, and whole fields.
type ReplayFilter struct {
	masks  []*regexp.Regexp
	ignore map[string]bool
}

func badRequest(format string, a ...any) error {
	return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf(format, a...)}
}

// NewReplayFilter checks and compiles a replay's masks and ignored fields;
// a bad one is a 400 naming it.
func NewReplayFilter(masks, ignore []string) (*ReplayFilter, error) {
	if len(masks) > api.MaxReplayMasks {
		return nil, badRequest("at most %d masks, got %d", api.MaxReplayMasks, len(masks))
	}
	f := &ReplayFilter{ignore: map[string]bool{}}
	for _, m := range masks {
		if m == "" {
			return nil, badRequest("an empty mask")
		}
		re, err := regexp.Compile(m)
		if err != nil {
			return nil, badRequest("mask %q: %v", m, err)
		}
		f.masks = append(f.masks, re)
	}
	for _, name := range ignore {
		if !slices.Contains(api.ReplayFields, name) {
			return nil, badRequest("cannot ignore %q: the fields are %s", name, strings.Join(api.ReplayFields, ", "))
		}
		f.ignore[name] = true
	}
	return f, nil
}

// mask replaces every match of every mask in s.
func (f *ReplayFilter) mask(s string) string {
	for _, re := range f.masks {
		s = re.ReplaceAllLiteralString(s, api.ReplayMaskText)
	}
	return s
}

// Differs names the parts of the outcome of got that differ from logged,
// leaving out the ignored fields and the masked parts of the output.
func (f *ReplayFilter) Differs(logged, got *api.TrajectoryStep) []string {
	var d []string
	add := func(name string, differ bool) {
		if differ && !f.ignore[name] {
			d = append(d, name)
		}
	}
	switch {
	case (logged.Error == nil) != (got.Error == nil):
		add("error", true)
		return d
	case logged.Error != nil:
		add("error", logged.Error.Code != got.Error.Code)
		return d
	}
	if a, b := logged.Result, got.Result; a != nil && b != nil {
		add("exit_code", a.ExitCode != b.ExitCode)
		add("stdout", a.Stdout != b.Stdout && f.mask(a.Stdout) != f.mask(b.Stdout))
		add("stderr", a.Stderr != b.Stderr && f.mask(a.Stderr) != f.mask(b.Stderr))
		add("timed_out", a.TimedOut != b.TimedOut)
		add("signal", a.Signal != b.Signal)
	}
	if a, b := logged.File, got.File; a != nil && b != nil {
		add("file", a.Size != b.Size || a.Mode != b.Mode || a.Type != b.Type || a.Target != b.Target)
	}
	return d
}
