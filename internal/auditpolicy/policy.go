// Package auditpolicy compiles a create's audit options (api.AuditSpec)
// into what the edge applies to each audit record as it arrives: the
// workspace filter for file records and the policy hooks ("kind:glob" ->
// flag, kill-step, fail-sandbox).
package auditpolicy

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
)

// Bounds on what a create may declare.
const (
	MaxWorkspace = 32
	MaxRules     = 32
	MaxPattern   = 256
)

// Kinds a rule's "on" may name, and the record kinds each selects (read
// and write split the file records by their op).
var ruleKinds = map[string]string{
	"exec":    api.AuditKindExec,
	"write":   api.AuditKindFile,
	"read":    api.AuditKindFile,
	"refused": api.AuditKindRefused,
	"signal":  api.AuditKindSignal,
	"connect": api.AuditKindConnect,
	"limit":   api.AuditKindLimit,
	"denied":  api.AuditKindDenied,
}

// Policy is a compiled api.AuditSpec. The zero Policy records everything
// and acts on nothing.
type Policy struct {
	off       bool     // the create turned the audit off
	workspace []string // clean absolute directories
	rules     []rule
}

type rule struct {
	on   string // as declared, named in the records it matches
	kind string // a record kind
	read bool   // file records: reads only (else all but reads)
	re   *regexp.Regexp
	do   string
}

// Compile checks spec (nil: the zero Policy) and compiles it. Its errors
// are meant for the client (a 400).
func Compile(spec *api.AuditSpec) (*Policy, error) {
	p := &Policy{}
	if spec == nil {
		return p, nil
	}
	if spec.Off && (len(spec.Workspace) > 0 || len(spec.Policy) > 0) {
		return nil, fmt.Errorf("audit.off: a sandbox that is not audited has no workspace or policy")
	}
	p.off = spec.Off
	if len(spec.Workspace) > MaxWorkspace {
		return nil, fmt.Errorf("audit.workspace: at most %d paths", MaxWorkspace)
	}
	for i, w := range spec.Workspace {
		if len(w) > MaxPattern || !path.IsAbs(w) || strings.ContainsRune(w, 0) {
			return nil, fmt.Errorf("audit.workspace[%d]: %q is not an absolute path", i, clip(w))
		}
		p.workspace = append(p.workspace, path.Clean(w))
	}
	if len(spec.Policy) > MaxRules {
		return nil, fmt.Errorf("audit.policy: at most %d rules", MaxRules)
	}
	for i, r := range spec.Policy {
		kindName, pattern, _ := strings.Cut(r.On, ":")
		kind, ok := ruleKinds[kindName]
		if !ok {
			return nil, fmt.Errorf("audit.policy[%d].on %q: want kind:pattern with kind one of exec, write, read, refused, signal, connect, limit, denied", i, clip(r.On))
		}
		if len(pattern) > MaxPattern || strings.ContainsRune(pattern, 0) || !utf8.ValidString(pattern) {
			return nil, fmt.Errorf("audit.policy[%d].on: the pattern is over %d bytes or not UTF-8", i, MaxPattern)
		}
		switch r.Do {
		case api.AuditDoFlag, api.AuditDoKillStep, api.AuditDoFailSandbox:
		default:
			return nil, fmt.Errorf("audit.policy[%d].do %q: want %s, %s or %s", i, clip(r.Do), api.AuditDoFlag, api.AuditDoKillStep, api.AuditDoFailSandbox)
		}
		if pattern == "" {
			pattern = "**"
		}
		p.rules = append(p.rules, rule{on: r.On, kind: kind, read: kindName == "read", re: globRE(pattern), do: r.Do})
	}
	return p, nil
}

// globRE compiles a glob: "**" any run, "*" any run without "/", "?" one
// character but "/"; everything else literal.
func globRE(g string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(g); {
		c, n := utf8.DecodeRuneInString(g[i:])
		switch {
		case strings.HasPrefix(g[i:], "**"):
			b.WriteString(".*")
			n = 2
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(g[i : i+n]))
		}
		i += n
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// InWorkspace reports whether a file record's path lies in a declared
// workspace (so it is not recorded). Relative paths are never in it: the
// kernel records them as the process named them.
func (p *Policy) InWorkspace(name string) bool {
	if !path.IsAbs(name) {
		return false
	}
	name = path.Clean(name)
	for _, w := range p.workspace {
		if name == w || strings.HasPrefix(name, w+"/") || w == "/" {
			return true
		}
	}
	return false
}

// Skip reports whether r is left out of the audit: a file operation whose
// names all lie in the workspace.
func (p *Policy) Skip(r *api.AuditRecord) bool {
	if r.Kind != api.AuditKindFile || len(p.workspace) == 0 {
		return false
	}
	return p.InWorkspace(r.Path) && (r.To == "" || p.InWorkspace(r.To))
}

// Match returns the first rule that selects r: its declared "on" and its
// action ("" when none matches).
func (p *Policy) Match(r *api.AuditRecord) (on, do string) {
	for _, ru := range p.rules {
		if ru.kind != r.Kind || (r.Kind == api.AuditKindFile && ru.read != (r.Op == api.AuditOpRead)) {
			continue
		}
		for _, s := range subjects(r) {
			if ru.re.MatchString(s) {
				return ru.on, ru.do
			}
		}
	}
	return "", ""
}

// Off reports whether the create turned the audit off.
func (p *Policy) Off() bool { return p != nil && p.off }

// Empty reports whether p neither filters nor acts.
func (p *Policy) Empty() bool {
	return p == nil || (!p.off && len(p.workspace) == 0 && len(p.rules) == 0)
}

// subjects are the strings of r a rule's pattern is matched against.
func subjects(r *api.AuditRecord) []string {
	switch r.Kind {
	case api.AuditKindExec:
		return []string{r.Path}
	case api.AuditKindFile:
		if r.To != "" {
			return []string{r.Path, r.To}
		}
		return []string{r.Path}
	case api.AuditKindRefused:
		return []string{r.Syscall}
	case api.AuditKindSignal:
		return []string{strconv.Itoa(r.Signal)}
	case api.AuditKindConnect:
		return []string{r.Dest}
	case api.AuditKindLimit:
		return []string{r.Op}
	case api.AuditKindDenied:
		return []string{r.Dest}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
