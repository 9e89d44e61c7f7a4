package iam

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

// twoReplicas opens the IAM twice over a real embedded NATS server, as two
// apiservers would.
func twoReplicas(t *testing.T) (*IAM, *IAM, string) {
	t.Helper()
	dir := t.TempDir()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir, NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	var out []*IAM
	for i := 0; i < 2; i++ {
		c, err := srv.Connect("iam-test", bus.RoleAPIServer, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		m, err := Open(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		out = append(out, m)
	}
	return out[0], out[1], dir
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBootstrapOnceAndRevocationReachesReplicas(t *testing.T) {
	a, b, dir := twoReplicas(t)
	ctx := context.Background()
	tok, err := a.Bootstrap(ctx, filepath.Join(dir, "a"))
	if err != nil || !strings.HasPrefix(tok, TokenPrefix) {
		t.Fatalf("bootstrap: %q %v", tok, err)
	}
	if tok2, err := b.Bootstrap(ctx, filepath.Join(dir, "b")); err != nil || tok2 != "" {
		t.Fatalf("second bootstrap made a token: %q %v", tok2, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b", "admin-token")); err == nil {
		t.Fatal("the second replica wrote an admin token")
	}
	eventually(t, "admin token on the other replica", func() bool { _, err := b.Authenticate(ctx, tok); return err == nil })
	root, _ := a.Authenticate(ctx, tok)
	if !root.Admin() {
		t.Fatalf("bootstrap principal %+v", root)
	}
	if _, err := a.CreateProject(ctx, root, &api.CreateProjectRequest{Name: "p", Quota: api.Quota{Sandboxes: 10}}); err != nil {
		t.Fatal(err)
	}
	nt, err := a.CreateToken(ctx, root, &api.CreateTokenRequest{Principal: "bot", Project: "p", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	// Only the hash is stored (b's watcher applies updates meanwhile).
	b.mu.RLock()
	for _, r := range b.tokens {
		if strings.Contains(r.ID, nt.Secret) {
			b.mu.RUnlock()
			t.Fatal("secret stored")
		}
	}
	b.mu.RUnlock()
	eventually(t, "new token on the other replica", func() bool { _, err := b.Authenticate(ctx, nt.Secret); return err == nil })
	bot, _ := b.Authenticate(ctx, nt.Secret)
	// Nesting cannot raise anything.
	if _, err := b.CreateProject(ctx, bot, &api.CreateProjectRequest{Name: "q", Quota: api.Quota{Sandboxes: 11}}); err == nil {
		t.Fatal("child quota above the parent's")
	}
	if _, err := b.UpdateProject(ctx, bot, "p", &api.UpdateProjectRequest{Quota: api.Quota{Sandboxes: 100}}); err == nil {
		t.Fatal("raised its own quota")
	}
	if tk, err := b.CreateToken(ctx, bot, &api.CreateTokenRequest{Principal: "x"}); err != nil || tk.Project != "p" {
		t.Fatalf("token default project: %+v %v", tk, err)
	}
	if _, err := b.CreateToken(ctx, bot, &api.CreateTokenRequest{Principal: "x", Project: "other"}); err == nil {
		t.Fatal("token outside the caller's project")
	}
	// Revoked on one replica: refused by the other.
	if err := b.RevokeToken(ctx, root, nt.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "revocation on the other replica", func() bool { _, err := a.Authenticate(ctx, nt.Secret); return err == ErrUnauthenticated })
	// Chain lists the binding quotas bottom-up.
	if _, err := a.CreateProject(ctx, root, &api.CreateProjectRequest{Name: "c", Parent: "p"}); err != nil {
		t.Fatal(err)
	}
	ch := a.Chain("p.c")
	if len(ch) != 1 || ch[0].Project != "p" || ch[0].Quota.Sandboxes != 10 {
		t.Fatalf("chain %+v", ch)
	}
}

func FuzzAuthenticateNeverPanics(f *testing.F) {
	m := &IAM{tokens: map[string]*tokenRecord{}, projects: map[string]*projectRecord{}, now: time.Now}
	for _, s := range []string{"", "wrn_", "wrn_abc", NewToken(), strings.Repeat("x", 300), "wrn_\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := m.Authenticate(context.Background(), s); err != ErrUnauthenticated {
			t.Fatalf("unknown token %q: %v", s, err)
		}
	})
}

// TestSees: the ownership rule reaches down the tree, never up or across,
// and the shared catalog (layers without an owner) is read by all and
// changed by root only.
func TestSees(t *testing.T) {
	root := &Principal{Role: api.RoleAdmin}
	p1 := &Principal{Project: "p1", Role: api.RoleAdmin}
	for _, c := range []struct {
		p           *Principal
		kind, owner string
		sees, chg   bool
	}{
		{p1, KindTrajectory, "p1", true, true},
		{p1, KindTrajectory, "p1.c", true, true},
		{p1, KindTrajectory, "p10", false, false},
		{p1, KindTrajectory, "p", false, false},
		{p1, KindSnapshot, "", false, false},
		{p1, KindLayer, "", true, false},
		{p1, KindLayer, "p2", false, false},
		{root, KindLayer, "", true, true},
		{root, KindSnapshot, "p2.x", true, true},
		{&Principal{Project: "p1.c"}, KindPool, "p1", false, false},
		{nil, KindLayer, "", false, false},
	} {
		if got := c.p.Sees(c.kind, c.owner); got != c.sees {
			t.Errorf("%+v sees %s of %q: %v", c.p, c.kind, c.owner, got)
		}
		if got := c.p.Changes(c.kind, c.owner); got != c.chg {
			t.Errorf("%+v changes %s of %q: %v", c.p, c.kind, c.owner, got)
		}
	}
}
