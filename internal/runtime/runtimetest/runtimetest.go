// Package runtimetest is the conformance suite every sandbox tier runs (in
// the style of containerd's snapshotter test suite): what the edge relies
// on of a runtime.Runtime, asserted the same way for each tier. A tier's
// tests call Run with a function that makes a fresh runtime and specs for
// it; the fake tier (internal/runtime/fake) runs it without root, the
// container tier as root.
package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// Tier is one runtime under test.
type Tier struct {
	Runtime runtime.Runtime
	// Spec returns a spec for a new sandbox named id, its directories
	// prepared (the test's temporary directories: removed by t).
	Spec func(t *testing.T, id string) *runtime.Spec
}

// timeout bounds each call of the suite; a loaded host may be slow.
const timeout = 30 * time.Second

// Run runs the suite; newTier is called once per subtest.
func Run(t *testing.T, newTier func(t *testing.T) Tier) {
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, tr Tier)
	}{
		{"StartExec", testStartExec},
		{"Env", testEnv},
		{"Files", testFiles},
		{"Attach", testAttach},
		{"Stop", testStop},
		{"DestroyUnknown", testDestroyUnknown},
		{"Leftovers", testLeftovers},
		{"Freeze", testFreeze},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newTier(t)) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// start starts a sandbox and destroys it when the test ends.
func start(t *testing.T, tr Tier, id string, edit ...func(*runtime.Spec)) *runtime.Instance {
	t.Helper()
	spec := tr.Spec(t, id)
	for _, f := range edit {
		f(spec)
	}
	inst, err := tr.Runtime.Start(ctxT(t), spec)
	if err != nil {
		t.Fatalf("Start %s: %v", id, err)
	}
	if inst.Handle.ID != id {
		t.Errorf("Start %s: handle names %q", id, inst.Handle.ID)
	}
	t.Cleanup(func() {
		_ = inst.Agent.Close()
		if err := tr.Runtime.Destroy(context.Background(), inst.Handle); err != nil {
			t.Errorf("Destroy %s: %v", id, err)
		}
	})
	return inst
}

// Result is one command's outcome.
type Result struct {
	Stdout, Stderr string
	agentproto.ExecResult
}

// Exec runs cmd (a shell command line) in the sandbox behind c.
func Exec(ctx context.Context, c *agentproto.Client, cmd string) (Result, error) {
	var out, errb bytes.Buffer
	var r Result
	err := c.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: cmd}, &r.ExecResult, func(resp *agentproto.Response) error {
		if resp.Stream == agentproto.StreamStderr {
			errb.Write(resp.Data)
		} else {
			out.Write(resp.Data)
		}
		return nil
	})
	r.Stdout, r.Stderr = out.String()+string(r.ExecResult.Stdout), errb.String()+string(r.ExecResult.Stderr)
	return r, err
}

func mustExec(t *testing.T, c *agentproto.Client, cmd string) Result {
	t.Helper()
	r, err := Exec(ctxT(t), c, cmd)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return r
}

func testStartExec(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-exec")
	if r := mustExec(t, inst.Agent, "echo hello"); r.Stdout != "hello\n" || r.ExitCode != 0 {
		t.Errorf("echo hello: %q exit %d (stderr %q)", r.Stdout, r.ExitCode, r.Stderr)
	}
	if r := mustExec(t, inst.Agent, "exit 3"); r.ExitCode != 3 {
		t.Errorf("exit 3: exit code %d", r.ExitCode)
	}
	if r := mustExec(t, inst.Agent, "false"); r.ExitCode != 1 {
		t.Errorf("false: exit code %d", r.ExitCode)
	}
}

func testEnv(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-env", func(s *runtime.Spec) {
		if s.Env == nil {
			s.Env = map[string]string{}
		}
		if s.Env["PATH"] == "" {
			s.Env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
		}
		s.Env["CONFORMANCE_VAR"] = "forty-two"
	})
	if r := mustExec(t, inst.Agent, "echo $CONFORMANCE_VAR"); r.Stdout != "forty-two\n" {
		t.Errorf("echo $CONFORMANCE_VAR: %q exit %d", r.Stdout, r.ExitCode)
	}
}

func testFiles(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-files")
	ctx := ctxT(t)
	const p = "/tmp/conformance/hello.txt"
	data := []byte("hello, conformance\n")
	if err := inst.Agent.Call(ctx, agentproto.OpFileWrite, &agentproto.WriteRequest{Path: p, Data: data}, nil, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
	var got bytes.Buffer
	var fi agentproto.FileInfo
	if err := inst.Agent.Call(ctx, agentproto.OpFileRead, &agentproto.PathRequest{Path: p}, &fi, func(r *agentproto.Response) error {
		got.Write(r.Data)
		return nil
	}); err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Errorf("read back %q, want %q", got.Bytes(), data)
	}
	var st agentproto.FileInfo
	if err := inst.Agent.Call(ctx, agentproto.OpFileStat, &agentproto.PathRequest{Path: p}, &st, nil); err != nil || st.Size != int64(len(data)) {
		t.Errorf("stat: %+v %v", st, err)
	}
	if r := mustExec(t, inst.Agent, "cat "+p); r.Stdout != string(data) {
		t.Errorf("cat of a written file: %q", r.Stdout)
	}
	if err := inst.Agent.Call(ctx, agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: p}, nil, nil); err != nil {
		t.Fatalf("remove: %v", err)
	}
	err := inst.Agent.Call(ctx, agentproto.OpFileStat, &agentproto.PathRequest{Path: p}, &st, nil)
	if !agentproto.IsCode(err, agentproto.ErrNotFound) {
		t.Errorf("stat after remove: %v, want %s", err, agentproto.ErrNotFound)
	}
}

// testAttach: a second channel (the edge after a restart) reaches the same
// sandbox, and closing the first one does not end it.
func testAttach(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-attach")
	ctx := ctxT(t)
	if err := inst.Agent.Call(ctx, agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/tmp/mark", Data: []byte("one")}, nil, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
	again, err := tr.Runtime.Attach(ctx, inst.Handle)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer again.Agent.Close()
	_ = inst.Agent.Close()
	if r := mustExec(t, again.Agent, "cat /tmp/mark"); r.Stdout != "one" {
		t.Errorf("through the attached channel: %q exit %d (%s)", r.Stdout, r.ExitCode, r.Stderr)
	}
}

// testStop: Destroy ends the agent's channel, is idempotent, and a
// destroyed sandbox cannot be attached (ErrGone).
func testStop(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-stop")
	ctx := ctxT(t)
	if err := tr.Runtime.Destroy(ctx, inst.Handle); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	select {
	case <-inst.Agent.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent's channel is still open 10 s after Destroy")
	}
	if err := tr.Runtime.Destroy(ctx, inst.Handle); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if again, err := tr.Runtime.Attach(ctx, inst.Handle); !errors.Is(err, runtime.ErrGone) {
		if again != nil {
			_ = again.Agent.Close()
		}
		t.Errorf("Attach after Destroy: %v, want ErrGone", err)
	}
}

// testDestroyUnknown: Destroy of a sandbox that was never made (a start
// that failed early) succeeds.
func testDestroyUnknown(t *testing.T, tr Tier) {
	spec := tr.Spec(t, "conf-never")
	h := runtime.Handle{ID: spec.ID, Socket: spec.StateDir + "/agent.sock"}
	if err := tr.Runtime.Destroy(ctxT(t), h); err != nil {
		t.Errorf("Destroy of a sandbox never started: %v", err)
	}
}

// testLeftovers: a live sandbox is among the leftovers (so a restarted edge
// that has no record of it destroys it); a destroyed one is not.
func testLeftovers(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-left")
	ctx := ctxT(t)
	if !hasLeftover(t, tr, inst.Handle.ID) {
		t.Fatalf("a live sandbox %s is not among the leftovers", inst.Handle.ID)
	}
	if err := tr.Runtime.Destroy(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if hasLeftover(t, tr, inst.Handle.ID) {
		t.Errorf("destroyed sandbox %s is still a leftover", inst.Handle.ID)
	}
}

func hasLeftover(t *testing.T, tr Tier, id string) bool {
	t.Helper()
	left, err := tr.Runtime.Leftovers(ctxT(t))
	if err != nil {
		t.Fatalf("Leftovers: %v", err)
	}
	for _, h := range left {
		if h.ID == id {
			return true
		}
	}
	return false
}

// testFreeze: a frozen sandbox answers nothing until it is thawed, and then
// serves as before.
func testFreeze(t *testing.T, tr Tier) {
	inst := start(t, tr, "conf-freeze")
	ctx := ctxT(t)
	if err := tr.Runtime.Freeze(ctx, inst.Handle); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("SKIP: %s cannot freeze: %v", tr.Runtime.Name(), err)
		}
		t.Fatalf("Freeze: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	r, err := Exec(short, inst.Agent, "echo frozen")
	cancel()
	if err == nil {
		_ = tr.Runtime.Thaw(ctx, inst.Handle)
		t.Fatalf("a frozen sandbox answered: %q", r.Stdout)
	}
	if err := tr.Runtime.Thaw(ctx, inst.Handle); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	if r := mustExec(t, inst.Agent, "echo thawed"); r.Stdout != "thawed\n" {
		t.Errorf("after Thaw: %q exit %d", r.Stdout, r.ExitCode)
	}
}

// GateRate samples a CPU gate's usage over d: the cores its group used.
func GateRate(t testing.TB, g runtime.CPUGate, d time.Duration) float64 {
	t.Helper()
	u0, _, err := g.Sample()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(d)
	u1, _, err := g.Sample()
	if err != nil {
		t.Fatal(err)
	}
	return float64(u1-u0) / float64(time.Since(t0).Nanoseconds())
}
