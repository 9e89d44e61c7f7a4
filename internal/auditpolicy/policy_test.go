package auditpolicy

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestMatchAndWorkspace(t *testing.T) {
	p, err := Compile(&api.AuditSpec{
		Workspace: []string{"/work/", "/tmp"},
		Policy: []api.AuditRule{
			{On: "write:/opt/toolkit/**", Do: api.AuditDoKillStep},
			{On: "exec:/tmp/*", Do: api.AuditDoFlag},
			{On: "refused:mount", Do: api.AuditDoFlag},
			{On: "limit", Do: api.AuditDoFailSandbox},
			{On: "connect:10.0.0.?:443", Do: api.AuditDoFlag},
			{On: "read:/proc/**", Do: api.AuditDoFlag},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		rec    api.AuditRecord
		on, do string
	}{
		{api.AuditRecord{Kind: api.AuditKindFile, Path: "/opt/toolkit/grade.py"}, "write:/opt/toolkit/**", api.AuditDoKillStep},
		{api.AuditRecord{Kind: api.AuditKindFile, Path: "/tmp/x", To: "/opt/toolkit/a/b"}, "write:/opt/toolkit/**", api.AuditDoKillStep},
		{api.AuditRecord{Kind: api.AuditKindFile, Path: "/opt/toolkitx"}, "", ""},
		{api.AuditRecord{Kind: api.AuditKindExec, Path: "/tmp/planted"}, "exec:/tmp/*", api.AuditDoFlag},
		{api.AuditRecord{Kind: api.AuditKindExec, Path: "/tmp/a/planted"}, "", ""},
		{api.AuditRecord{Kind: api.AuditKindRefused, Syscall: "mount"}, "refused:mount", api.AuditDoFlag},
		{api.AuditRecord{Kind: api.AuditKindRefused, Syscall: "umount2"}, "", ""},
		{api.AuditRecord{Kind: api.AuditKindLimit, Op: api.AuditLimitOOM}, "limit", api.AuditDoFailSandbox},
		{api.AuditRecord{Kind: api.AuditKindConnect, Dest: "10.0.0.7:443"}, "connect:10.0.0.?:443", api.AuditDoFlag},
		{api.AuditRecord{Kind: api.AuditKindConnect, Dest: "10.0.0.17:443"}, "", ""},
		{api.AuditRecord{Kind: api.AuditKindFile, Op: api.AuditOpRead, Path: "/proc/kpagecgroup"}, "read:/proc/**", api.AuditDoFlag},
		{api.AuditRecord{Kind: api.AuditKindFile, Op: api.AuditOpRead, Path: "/opt/toolkit/grade.sh"}, "", ""},
		{api.AuditRecord{Kind: api.AuditKindFile, Op: "write", Path: "/proc/sys/x"}, "", ""},
	}
	for _, c := range cases {
		on, do := p.Match(&c.rec)
		if on != c.on || do != c.do {
			t.Errorf("%+v: got %q %q, want %q %q", c.rec, on, do, c.on, c.do)
		}
	}
	skip := map[string]bool{"/work/a": true, "/work": true, "/tmp/x": true, "/workx/a": false, "a/b": false, "/etc/passwd": false, "/work/../etc/x": false}
	for name, want := range skip {
		if got := p.Skip(&api.AuditRecord{Kind: api.AuditKindFile, Path: name}); got != want {
			t.Errorf("Skip(%q) = %v, want %v", name, got, want)
		}
	}
	if p.Skip(&api.AuditRecord{Kind: api.AuditKindFile, Path: "/work/a", To: "/etc/a"}) {
		t.Error("a rename out of the workspace was skipped")
	}
	if p.Skip(&api.AuditRecord{Kind: api.AuditKindExec, Path: "/work/a"}) {
		t.Error("an exec in the workspace was skipped")
	}
}

func TestCompileRefusesBadInput(t *testing.T) {
	bad := []api.AuditSpec{
		{Workspace: []string{"relative"}},
		{Workspace: make([]string, MaxWorkspace+1)},
		{Policy: []api.AuditRule{{On: "open:/x", Do: "flag"}}},
		{Policy: []api.AuditRule{{On: "write:/x", Do: "explode"}}},
		{Policy: []api.AuditRule{{On: "write:" + strings.Repeat("a", MaxPattern+1), Do: "flag"}}},
		{Policy: make([]api.AuditRule, MaxRules+1)},
	}
	for _, b := range bad {
		if _, err := Compile(&b); err == nil {
			t.Errorf("Compile(%+v) accepted", b)
		}
	}
	if p, err := Compile(nil); err != nil || !p.Empty() {
		t.Errorf("Compile(nil) = %v, %v", p, err)
	}
}

func FuzzCompile(f *testing.F) {
	f.Add("write:/opt/**", "flag", "/opt/x")
	f.Add("exec:[", "kill-step", "[")
	f.Add("exec:\xe2\x82", "flag", "\xe2") // a cut rune once panicked regexp.MustCompile
	f.Fuzz(func(t *testing.T, on, do, subject string) {
		p, err := Compile(&api.AuditSpec{Policy: []api.AuditRule{{On: on, Do: do}}})
		if err != nil {
			return
		}
		p.Match(&api.AuditRecord{Kind: api.AuditKindExec, Path: subject})
	})
}
