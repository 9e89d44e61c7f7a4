package bus

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// TestStorageAccount: a charge counts for the project and every ancestor,
// a limit binds the whole subtree, concurrent charges add up, a count
// never goes below zero, and a refusal is a 413 storage_quota.
func TestStorageAccount(t *testing.T) {
	dir := t.TempDir()
	auth, err := EnsureAuth(filepath.Join(dir, "auth"), []string{"n1"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Listen: freeAddr(t), Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	c, err := srv.Connect("api", RoleAPIServer, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := c.Storage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetLimit(ctx, "a", 1000); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := st.Add(ctx, "a.b", 10); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for p, want := range map[string]int64{"a.b": 200, "a": 200, "": 200, "a.c": 0} {
		if r, _, err := st.Get(ctx, p); err != nil || r.Bytes != want {
			t.Fatalf("%q holds %d (%v), want %d", p, r.Bytes, err, want)
		}
	}
	if err := st.Check(ctx, "a.b", 800); err != nil {
		t.Fatalf("800 more fit a's 1000: %v", err)
	}
	err = st.Check(ctx, "a.b.c", 801)
	var se *StorageError
	if !errors.As(err, &se) || se.Project != "a" || se.Used != 200 || se.Limit != 1000 {
		t.Fatalf("801 more under a.b.c: %v", err)
	}
	var ae *api.Error
	if !errors.As(QuotaError(err), &ae) || ae.Code != api.CodeTooLarge || ae.Reason != api.ReasonStorageQuota {
		t.Fatalf("the answer: %v", QuotaError(err))
	}
	if err := st.Check(ctx, "z", 1<<40); err != nil {
		t.Fatalf("a project without a limit: %v", err)
	}
	if err := st.Add(ctx, "a.b", -500); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := st.Get(ctx, "a"); r.Bytes != 0 || r.Limit != 1000 {
		t.Fatalf("after freeing more than held: %+v", r)
	}
	if err := st.AddTrajectory(ctx, "a|run", 42); err != nil {
		t.Fatal(err)
	}
	if n, err := st.TrajectoryBytes(ctx, "a|run"); err != nil || n != 42 {
		t.Fatalf("trajectory bytes %d %v", n, err)
	}
	if err := st.ForgetTrajectory(ctx, "a|run"); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.TrajectoryBytes(ctx, "a|run"); n != 0 {
		t.Fatalf("a forgotten trajectory holds %d", n)
	}
}
