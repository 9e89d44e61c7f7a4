package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func mustCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if warren.CodeOf(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

func TestIAMProjectsQuotasTokens(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	admin := s.C
	small := api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32}

	// The cluster admin makes a top project and an admin token for it.
	if _, err := admin.CreateProject(ctx, api.CreateProjectRequest{Name: "acme", Quota: api.Quota{Sandboxes: 3, CPU: 2, MemoryMB: 1024}}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateToken(ctx, api.CreateTokenRequest{Principal: "acme-lead", Project: "acme", Role: api.RoleAdmin})
	if err != nil || !strings.HasPrefix(tok.Secret, "wrn_") {
		t.Fatalf("token: %v %+v", err, tok)
	}
	acme := warren.New(s.URL, tok.Secret)

	// Nesting cannot exceed what the parent holds, at any depth.
	_, err = acme.CreateProject(ctx, api.CreateProjectRequest{Name: "rl", Quota: api.Quota{Sandboxes: 5}})
	mustCode(t, "child quota above the parent's", err, api.CodeForbidden)
	if _, err := acme.CreateProject(ctx, api.CreateProjectRequest{Name: "rl", Quota: api.Quota{Sandboxes: 2}}); err != nil {
		t.Fatal(err)
	}
	parent := "acme.rl"
	for _, name := range []string{"a", "b", "c", "d"} {
		p, err := acme.CreateProject(ctx, api.CreateProjectRequest{Name: name, Parent: parent})
		if err != nil {
			t.Fatalf("nest %s under %s: %v", name, parent, err)
		}
		parent = p.ID
	}
	if parent != "acme.rl.a.b.c.d" {
		t.Fatalf("deep project id %q", parent)
	}
	_, err = acme.CreateProject(ctx, api.CreateProjectRequest{Name: "x", Parent: parent, Quota: api.Quota{CPU: 3}})
	mustCode(t, "deep child above the top's cpu", err, api.CodeForbidden)
	// Nobody raises their own quota; a parent's admin may not exceed its own either.
	_, err = acme.UpdateProject(ctx, "acme", api.UpdateProjectRequest{Quota: api.Quota{Sandboxes: 100}})
	mustCode(t, "raise own quota", err, api.CodeForbidden)
	_, err = acme.UpdateProject(ctx, "acme.rl", api.UpdateProjectRequest{Quota: api.Quota{Sandboxes: 4}})
	mustCode(t, "raise child above parent", err, api.CodeForbidden)
	_, err = acme.CreateProject(ctx, api.CreateProjectRequest{Name: "evil", Parent: "other"})
	mustCode(t, "project outside scope", err, api.CodeForbidden)

	// Tokens: never more role or reach than the issuer's.
	mtok, err := acme.CreateToken(ctx, api.CreateTokenRequest{Principal: "agent-1", Project: "acme.rl", Role: api.RoleMember})
	if err != nil {
		t.Fatal(err)
	}
	member := warren.New(s.URL, mtok.Secret)
	_, err = member.CreateToken(ctx, api.CreateTokenRequest{Principal: "x", Role: api.RoleMember})
	mustCode(t, "member issuing tokens", err, api.CodeForbidden)
	_, err = member.CreateProject(ctx, api.CreateProjectRequest{Name: "sub"})
	mustCode(t, "member creating projects", err, api.CodeForbidden)
	_, err = acme.CreateToken(ctx, api.CreateTokenRequest{Principal: "x", Project: "beta"})
	mustCode(t, "token outside scope", err, api.CodeForbidden)
	_, err = acme.CreateToken(ctx, api.CreateTokenRequest{Principal: "x", Project: "acme.rl", Role: "root"})
	mustCode(t, "unknown role", err, api.CodeInvalid)

	// Quotas are enforced at create: acme.rl allows 2 sandboxes.
	var ids []string
	for i := 0; i < 2; i++ {
		sb, err := member.Create(ctx, small)
		if err != nil {
			t.Fatalf("create %d in acme.rl: %v", i, err)
		}
		if sb.Project != "acme.rl" {
			t.Fatalf("sandbox project %q", sb.Project)
		}
		ids = append(ids, sb.ID)
		t.Cleanup(func() { _, _ = admin.Delete(context.Background(), sb.ID) })
	}
	_, err = member.Create(ctx, small)
	mustCode(t, "third sandbox over the quota of 2", err, api.CodeForbidden)
	// acme itself allows 3 in all: one more in acme, then none.
	sb, err := acme.Create(ctx, small)
	if err != nil {
		t.Fatalf("create in acme: %v", err)
	}
	t.Cleanup(func() { _, _ = admin.Delete(context.Background(), sb.ID) })
	_, err = acme.Create(ctx, small)
	mustCode(t, "fourth sandbox over acme's 3", err, api.CodeForbidden)
	_, err = admin.BatchCreate(ctx, api.BatchCreateRequest{Count: 2, Spec: api.CreateSandboxRequest{Image: "busybox", Project: "acme.rl.a", CPU: 0.1, MemoryMB: 32}})
	mustCode(t, "batch over the quota", err, api.CodeForbidden)
	_, err = member.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Project: "acme", CPU: 0.1})
	mustCode(t, "member creating above its project", err, api.CodeForbidden)
	p, err := acme.Project(ctx, "acme")
	if err != nil || p.Usage == nil {
		t.Fatalf("project: %v %+v", err, p)
	}

	// Another project sees none of it, whatever headers it forges.
	if _, err := admin.CreateProject(ctx, api.CreateProjectRequest{Name: "beta"}); err != nil {
		t.Fatal(err)
	}
	btok, err := admin.CreateToken(ctx, api.CreateTokenRequest{Principal: "b", Project: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	beta := warren.New(s.URL, btok.Secret)
	_, err = beta.Get(ctx, ids[0])
	mustCode(t, "get across projects", err, api.CodeNotFound)
	_, err = beta.Exec(ctx, ids[0], api.ExecRequest{Cmd: "true"})
	mustCode(t, "exec across projects", err, api.CodeNotFound)
	_, err = beta.Delete(ctx, ids[0])
	mustCode(t, "delete across projects", err, api.CodeNotFound)
	code, _ := s.rawRequest(t, "GET", "/v1/sandboxes/"+ids[0], btok.Secret, nil, map[string]string{"Warren-Scope": "", "Warren-Sandbox": "x"})
	if code != 404 {
		t.Fatalf("forged internal headers: %d", code)
	}
	if l, err := beta.List(ctx, warren.ListOptions{}); err != nil || len(l) != 0 {
		t.Fatalf("beta lists %d sandboxes (%v)", len(l), err)
	}
	if l, err := member.List(ctx, warren.ListOptions{}); err != nil || len(l) != 2 {
		t.Fatalf("acme.rl lists %d sandboxes (%v), want 2", len(l), err)
	}
	if l, err := acme.List(ctx, warren.ListOptions{}); err != nil || len(l) != 3 {
		t.Fatalf("acme lists %d sandboxes (%v), want 3", len(l), err)
	}
	if r, err := member.Exec(ctx, ids[0], api.ExecRequest{Cmd: "echo in"}); err != nil || r.Stdout != "in\n" {
		t.Fatalf("exec in own project: %v", err)
	}
	if ps, err := beta.Projects(ctx); err != nil || len(ps) != 1 || ps[0].ID != "beta" {
		t.Fatalf("beta sees projects %+v (%v)", ps, err)
	}

	// A project with sandboxes or subprojects cannot be deleted.
	mustCode(t, "delete project with sandboxes", acme.DeleteProject(ctx, "acme.rl.a.b.c.d.x"), api.CodeNotFound)
	mustCode(t, "delete project with subprojects", acme.DeleteProject(ctx, "acme.rl.a"), api.CodeConflict)
	if err := acme.DeleteProject(ctx, "acme.rl.a.b.c.d"); err != nil {
		t.Fatalf("delete empty project: %v", err)
	}
	mustCode(t, "delete project with sandboxes", acme.DeleteProject(ctx, "acme.rl"), api.CodeConflict)

	// Viewers read, never write.
	vtok, err := acme.CreateToken(ctx, api.CreateTokenRequest{Principal: "dash", Role: api.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	viewer := warren.New(s.URL, vtok.Secret)
	if _, err := viewer.Get(ctx, ids[0]); err != nil {
		t.Fatalf("viewer get: %v", err)
	}
	_, err = viewer.Create(ctx, small)
	mustCode(t, "viewer create", err, api.CodeForbidden)
	_, err = viewer.Exec(ctx, ids[0], api.ExecRequest{Cmd: "true"})
	mustCode(t, "viewer exec", err, api.CodeForbidden)

	// Revoked, expired and malformed tokens are 401; secrets never listed.
	toks, err := acme.Tokens(ctx)
	if err != nil || len(toks) < 3 {
		t.Fatalf("tokens: %v %d", err, len(toks))
	}
	for _, tk := range toks {
		if tk.Secret != "" {
			t.Fatalf("listed token shows its secret")
		}
	}
	if err := acme.RevokeToken(ctx, mtok.ID); err != nil {
		t.Fatal(err)
	}
	_, err = member.List(ctx, warren.ListOptions{})
	mustCode(t, "revoked token", err, api.CodeUnauthorized)
	etok, err := acme.CreateToken(ctx, api.CreateTokenRequest{Principal: "brief", ExpiresIn: 1})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	_, err = warren.New(s.URL, etok.Secret).List(ctx, warren.ListOptions{})
	mustCode(t, "expired token", err, api.CodeUnauthorized)
	for _, bad := range []string{"wrn_", "wrn_" + strings.Repeat("a", 200), "Bearer", "wrn_AAAAAAAAAAAAAAAAAAAAAA", tok.Secret + "x"} {
		_, err = warren.New(s.URL, bad).List(ctx, warren.ListOptions{})
		mustCode(t, "malformed token", err, api.CodeUnauthorized)
	}
	// A deleted project's tokens stop working.
	if err := acme.DeleteProject(ctx, "acme.rl.a.b.c"); err != nil {
		t.Fatal(err)
	}
}

func TestBatchCreateAndSelector(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	res, err := s.C.BatchCreate(ctx, api.BatchCreateRequest{Count: 6, Spec: api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32, Labels: map[string]string{"job": "b1"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range res.IDs {
		t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), id) })
	}
	if res.Created != 6 || len(res.IDs) != 6 || len(res.Sandboxes) != 6 || res.Failed != 0 {
		t.Fatalf("batch: %+v", res)
	}
	if r, err := s.C.Exec(ctx, res.IDs[5], api.ExecRequest{Cmd: "echo b"}); err != nil || r.Stdout != "b\n" {
		t.Fatalf("exec in a batch sandbox: %v", err)
	}
	for _, bad := range []api.BatchCreateRequest{{Count: 0, Spec: api.CreateSandboxRequest{Image: "busybox"}}, {Count: 70000, Spec: api.CreateSandboxRequest{Image: "busybox"}}} {
		_, err := s.C.BatchCreate(ctx, bad)
		mustCode(t, "bad batch count", err, api.CodeInvalid)
	}
	// node_selector: no node carries the label.
	once := warren.New(s.URL, s.Token, warren.WithRetry(1, 0, 0))
	_, err = once.Create(ctx, api.CreateSandboxRequest{Image: "busybox", NodeSelector: map[string]string{"gpu": "h100"}})
	mustCode(t, "unsatisfiable node_selector", err, api.CodeUnavailable)
	_, err = s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", NodeSelector: map[string]string{"bad key!": "x"}})
	mustCode(t, "malformed node_selector", err, api.CodeInvalid)
	// The heartbeat counts the job.
	deadline := time.Now().Add(5 * time.Second)
	for {
		nodes, err := s.C.Nodes(ctx)
		if err == nil && len(nodes) == 1 && nodes[0].Jobs["b1"] == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job count not in the heartbeat: %+v %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestCLIProjectsTokens(t *testing.T) {
	parallel(t)
	s := startServer(t)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bins.warren, append([]string{"--url", s.URL, "--token", s.Token}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("warren %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if id := run("project", "create", "cli", "--sandboxes", "5", "--cpu", "4"); id != "cli" {
		t.Fatalf("project create: %q", id)
	}
	if id := run("project", "create", "sub", "--parent", "cli", "--sandboxes", "2"); id != "cli.sub" {
		t.Fatalf("nested: %q", id)
	}
	if out := run("project", "ls"); !strings.Contains(out, "cli.sub") || !strings.Contains(out, "sandboxes=2") {
		t.Fatalf("project ls:\n%s", out)
	}
	secret := run("token", "create", "ci", "--project", "cli.sub", "--role", "viewer", "--expires-in", "1h")
	if !strings.HasPrefix(secret, "wrn_") {
		t.Fatalf("token create: %q", secret)
	}
	if out := run("token", "ls"); !strings.Contains(out, "cli.sub") || strings.Contains(out, secret) {
		t.Fatalf("token ls:\n%s", out)
	}
	run("project", "rm", "cli.sub")
}
