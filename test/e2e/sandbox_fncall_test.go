package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func fn(t *testing.T, s *server, req api.FnCallRequest) *api.ExecResult {
	t.Helper()
	r, err := s.C.FnCall(context.Background(), req)
	if err != nil {
		t.Fatalf("fncall %+v: %v\n%s", req, err, tail(s.logs.String(), 20))
	}
	return r
}

func TestFnCall(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	if r := fn(t, s, api.FnCallRequest{Cmd: "echo hello"}); r.ExitCode != 0 || r.Stdout != "hello\n" {
		t.Fatalf("echo: %+v", r)
	}
	r := fn(t, s, api.FnCallRequest{Argv: []string{"sh", "-c", "cat /work/in.txt; read x; echo \"$x $GREETING\" >&2; exit 3"},
		Files: map[string][]byte{"/work/in.txt": []byte("from file\n")}, Stdin: "from stdin\n", Env: map[string]string{"GREETING": "hi"}})
	if r.ExitCode != 3 || r.Stdout != "from file\n" || r.Stderr != "from stdin hi\n" {
		t.Fatalf("files/stdin/env: %+v", r)
	}
	if r := fn(t, s, api.FnCallRequest{Cmd: "sleep 10", Timeout: 0.3}); !r.TimedOut {
		t.Fatalf("timeout: %+v", r)
	}
	if r := fn(t, s, api.FnCallRequest{Cmd: "pwd; echo x > /etc/x || echo read-only"}); r.Stdout != "/work\nread-only\n" {
		t.Fatalf("read-only root: %+v", r)
	}
	// Listed sandboxes are unaffected: workers are nobody's.
	if l, _ := s.C.List(ctx, warren.ListOptions{}); len(l) > 0 {
		for _, sb := range l {
			if sb.Tier == api.TierFnCall {
				t.Fatalf("worker listed: %+v", sb)
			}
		}
	}
	var ae *api.Error
	for _, bad := range []api.FnCallRequest{
		{},                              // no command
		{Cmd: "x", Argv: []string{"x"}}, // both
		{Cmd: "x", Files: map[string][]byte{"/etc/passwd": nil}}, // not writable
		{Cmd: "x", Files: map[string][]byte{"/work/../etc/x": nil}},
		{Cmd: "x", Timeout: -1},
		{Cmd: "x", Tier: "container"},
		{Cmd: "x", Image: "no-such-image"},
	} {
		if _, err := s.C.FnCall(ctx, bad); !errors.As(err, &ae) || ae.Code == api.CodeInternal {
			t.Errorf("bad task %+v: %v", bad, err)
		}
	}
	if _, err := s.C.FnCall(ctx, api.FnCallRequest{Cmd: "x", Files: map[string][]byte{"/work/big": make([]byte, 900<<10)}}); !errors.As(err, &ae) || (ae.Code != api.CodeTooLarge) {
		t.Errorf("oversized files: %v", err)
	}
}

// TestFnCallResetIsolation: a task that forks daemons, writes into every
// writable directory, changes its environment and leaves IPC objects must
// leave nothing that a later task on the same worker can see.
func TestFnCallResetIsolation(t *testing.T) {
	s := sharedServer(t)
	shape := api.FnCallRequest{CPU: 0.25, MemoryMB: 96}
	attack := shape
	attack.Cmd = `
(while true; do sleep 1; done) &
nohup sleep 1000 >/dev/null 2>&1 &
setsid sh -c 'trap "" TERM HUP; sleep 1000' &
n=0
for d in $(find / -xdev -type d 2>/dev/null) /dev/shm /dev/mqueue /tmp /work; do
  case "$d" in /proc*|/sys*) continue;; esac
  if (echo pwned > "$d/.pwned") 2>/dev/null; then n=$((n+1)); echo "wrote $d"; fi
done
mkdir -p /tmp/locked/deep && echo x > /tmp/locked/deep/f && chmod 000 /tmp/locked/deep /tmp/locked
export LEAK=yes
echo 'export LEAK=yes' >> /root/.profile
f() { echo leaked function; }
umask 077
renice -n 19 -p $$ >/dev/null 2>&1
echo "wrote $n dirs"
`
	r := fn(t, s, attack)
	if !strings.Contains(r.Stdout, "wrote /tmp\n") || !strings.Contains(r.Stdout, "wrote /work\n") || !strings.Contains(r.Stdout, "wrote /dev/shm\n") {
		t.Fatalf("the attack could not even write the scratch dirs: %+v", r)
	}
	if strings.Contains(r.Stdout, "wrote /etc\n") || strings.Contains(r.Stdout, "wrote /\n") || strings.Contains(r.Stdout, "wrote /dev\n") {
		t.Fatalf("the attack wrote into the read-only root: %s", r.Stdout)
	}
	t.Logf("attack: %s", r.Stdout)
	// Every worker of the shape gets checked: run more checks than workers.
	check := shape
	check.Cmd = `
find / -xdev -name '.pwned' 2>/dev/null
ls -A /tmp /var/tmp /root /home /run /work /dev/shm /dev/mqueue
ps -o pid,args | grep -v -e 'ps -o' -e grep -e '^ *PID' | grep -c sleep
echo "LEAK=$LEAK"
type f >/dev/null 2>&1 && echo "f defined"
echo "umask $(umask) nice $(awk '{print $19}' /proc/self/stat)"
`
	for i := 0; i < 8; i++ {
		r := fn(t, s, check)
		want := "/dev/mqueue:\n\n/dev/shm:\n\n/home:\n\n/root:\n\n/run:\n\n/tmp:\n\n/var/tmp:\n\n/work:\n0\nLEAK=\numask 0022 nice 0\n"
		if r.Stdout != want {
			t.Fatalf("check %d saw traces of the earlier task:\n%s\nstderr: %s", i, r.Stdout, r.Stderr)
		}
	}
	// The workers were reused, not remade per task.
	nodes, err := s.C.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, p := range n.Pools {
			if strings.HasPrefix(p.Name, "fncall:busybox/0.25cpu") && p.Size > 4 {
				t.Errorf("too many workers for 9 sequential tasks: %+v", p)
			}
		}
	}
}
