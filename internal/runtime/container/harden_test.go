package container

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine/confinetest"
)

// TestSignalsToPID1: no signal that a process of the sandbox can send to
// PID 1 (the agent), by any means, ends it: every signal number by kill,
// and forged siginfo (sigqueue, pidfd_send_signal, F_SETSIG on a pipe),
// which a Go program would take for a fault of its own.
func TestSignalsToPID1(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sigs")
	installIPCHelper(t, spec)
	inst := f.start(t, spec)
	for _, m := range confinetest.SignalMethods {
		for sig := 1; sig <= 64; sig++ {
			sent := run(t, inst.Agent, "/bin/ipc", "signal-pid1", m, strconv.Itoa(sig))
			if o := run(t, inst.Agent, "/bin/echo", "alive"); o.stdout != "alive\n" {
				t.Fatalf("after %s of signal %d (%q): echo gave %+v", m, sig, sent.stdout, o)
			}
		}
	}
	if o := run(t, inst.Agent, "/bin/cat", "/proc/1/status"); !strings.Contains(o.stdout, "State:") {
		t.Fatalf("status of PID 1: %+v", o)
	}
}

// TestShmPastMemoryLimit: filling /dev/shm past the sandbox's memory
// limit neither ends the agent nor escapes the limit: /dev/shm is sized
// within the limit, and the command returns.
func TestShmPastMemoryLimit(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "shm")
	spec.MemoryMB = 64
	inst := f.start(t, spec)
	o := sh(t, inst.Agent, "dd if=/dev/zero of=/dev/shm/f bs=1M count=200; echo dd=$?; ls -l /dev/shm/f")
	t.Logf("dd: %q %q", o.stdout, o.stderr)
	if o := run(t, inst.Agent, "/bin/echo", "alive"); o.stdout != "alive\n" {
		t.Fatalf("after filling /dev/shm: echo gave %+v", o)
	}
	o = sh(t, inst.Agent, "df -m /dev/shm | tail -1")
	fs := strings.Fields(o.stdout)
	if len(fs) < 2 {
		t.Fatalf("df: %+v", o)
	}
	if size, err := strconv.Atoi(fs[1]); err != nil || size > int(spec.MemoryMB) {
		t.Fatalf("/dev/shm is %q MiB at memory_mb %d", fs[1], spec.MemoryMB)
	}
}

// TestMemfdPastMemoryLimit: memory that no process maps (a memfd) filled
// past the limit does not make the OOM killer end the agent.
func TestMemfdPastMemoryLimit(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "memfd")
	spec.MemoryMB = 64
	installIPCHelper(t, spec)
	inst := f.start(t, spec)
	o := sh(t, inst.Agent, "/bin/ipc memfd 200; echo rc=$?")
	t.Logf("memfd: %q %q %+v", o.stdout, o.stderr, o.res)
	if o := run(t, inst.Agent, "/bin/echo", "alive"); o.stdout != "alive\n" {
		t.Fatalf("after filling a memfd: echo gave %+v", o)
	}
	// The sandbox's processes start at oom_score_adj 0 and cannot lower it.
	o = sh(t, inst.Agent, "cat /proc/self/oom_score_adj; echo -1 > /proc/self/oom_score_adj && echo lowered")
	if o.stdout != "0\n" {
		t.Fatalf("oom_score_adj: %+v", o)
	}
}

// TestStormStaysAnswerable: a command whose processes hit every limit at
// once (a fork bomb at the pids limit, anonymous memory, /dev/shm and a
// memfd past the memory limit, a disk filler, an output flood) returns
// at its timeout, and the sandbox answers afterwards.
func TestStormStaysAnswerable(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "storm")
	spec.MemoryMB, spec.Pids = 64, 64
	installIPCHelper(t, spec)
	inst := f.start(t, spec)
	storm := `
dd if=/dev/zero of=/dev/shm/f bs=1M count=200 2>/dev/null &
/bin/ipc memfd 200 >/dev/null &
dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>/dev/null &
dd if=/dev/zero bs=1M count=300 2>/dev/null | tr '\0' x &
(b(){ [ -e /tmp/stop ] && return; b | b & }; b) 2>/dev/null &
x=a; while true; do x=$x$x; done
`
	start := time.Now()
	o := runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: storm, Timeout: 5 * time.Second, OutputCap: 1 << 20})
	t.Logf("storm: %v, %+v, %d bytes out, stderr %q", time.Since(start), o.res, len(o.stdout), o.stderr)
	if !o.res.TimedOut && o.res.ExitCode == 0 {
		t.Fatalf("storm ended early: %+v", o.res)
	}
	// The agent answers file operations without a fork: stop the fork
	// bomb (it checks the file before each fork; its processes outlive the
	// command, whose group was killed while some were forking). Until it
	// has died out an exec may answer that it cannot fork: an answer too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	writeStart := time.Now()
	if err := inst.Agent.Call(ctx, agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/tmp/stop"}, nil, nil); err != nil {
		t.Fatalf("file write after the storm: %v", err)
	}
	t.Logf("file write took %v", time.Since(writeStart))
	deadline := time.Now().Add(30 * time.Second)
	ctx, cancel = context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for {
		var res agentproto.ExecResult
		var out strings.Builder
		err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "rm -f /dev/shm/f /tmp/fill; echo alive"}, &res,
			func(r *agentproto.Response) error { out.Write(r.Data); return nil })
		if err == nil && out.String() == "alive\n" {
			break
		}
		if err != nil && !agentproto.IsCode(err, agentproto.ErrInternal) && !agentproto.IsCode(err, agentproto.ErrPidsLimit) || time.Now().After(deadline) {
			t.Fatalf("after the storm: %q %+v %v", out.String(), res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAgentAnswersUnderCPUFlood: a sandbox whose processes keep many
// threads busy at its CPU quota does not starve its agent: the agent's
// threads share the quota with the box as one group, not with each busy
// process (cgroups.go, the box), so calls that need no fork answer within
// a few quota periods each.
func TestAgentAnswersUnderCPUFlood(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "cpuflood")
	spec.CPU, spec.Pids = 0.1, 100
	inst := f.start(t, spec)
	o := sh(t, inst.Agent, `for i in $(seq 40); do (while [ ! -e /tmp/stop ]; do :; done) >/dev/null 2>&1 & done; echo started`)
	if o.stdout != "started\n" {
		t.Fatalf("flood: %+v", o)
	}
	time.Sleep(500 * time.Millisecond) // the quota is spent from here on
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var slowest time.Duration
	for i := range 10 {
		start := time.Now()
		var info agentproto.FileInfo
		if err := inst.Agent.Call(ctx, agentproto.OpFileStat, &agentproto.PathRequest{Path: "/tmp"}, &info, nil); err != nil {
			t.Fatalf("stat %d under the flood: %v", i, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("slowest of 10 stats under a flood of 40 busy processes at 0.1 core: %v", slowest)
	// At 0.1 core a period gives the sandbox 10 ms; shared among 41
	// runnable tasks, the agent would wait seconds for each call.
	if slowest > time.Second {
		t.Errorf("a stat under the flood took %v", slowest)
	}
	if err := inst.Agent.Call(ctx, agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/tmp/stop"}, nil, nil); err != nil {
		t.Fatalf("stop the flood: %v", err)
	}
}

// TestNoHostPathsInside: nothing a process of the sandbox can read names
// a host path: not PID 1's command line (the agent's path), not the mount
// table (the overlay's layer, upper and work directories).
func TestNoHostPathsInside(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "paths")
	inst := f.start(t, spec)
	for _, p := range []string{"/proc/1/cmdline", "/proc/self/mountinfo", "/proc/1/mountinfo", "/proc/mounts"} {
		o := run(t, inst.Agent, "/bin/cat", p)
		if o.res.ExitCode != 0 {
			t.Fatalf("cat %s: %+v", p, o)
		}
		for _, host := range []string{f.base, buildDir, agentBin} {
			if strings.Contains(o.stdout, host) {
				t.Errorf("%s names the host path %s:\n%s", p, host, o.stdout)
			}
		}
		if p == "/proc/1/cmdline" && o.stdout != "warren-agent\x00" {
			t.Errorf("PID 1's command line: %q", o.stdout)
		}
	}
}
