package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
	"github.com/warrenhq/warren/internal/runtime"
)

// Wipe and Reroot reuse the container of a deleted sandbox. Wipe: the
// agent kills every other process, removes SysV IPC objects, forgets its
// sessions and checks its own attributes; the network namespace must hold
// no socket (a TIME_WAIT connection would show in the next sandbox's
// /proc/net/tcp and keep its port). Reroot: confine.Reroot pivots the
// sandbox into a fresh overlay (and removes its POSIX message queues), and
// the agent moves to it. Resume: the agent serves again, with the new
// sandbox's environment and user. Namespaces, cgroups and the agent stay: that
// is the saving.

// Wipe implements runtime.Recycler.
func (r *Runtime) Wipe(ctx context.Context, inst *runtime.Instance) error {
	if err := inst.Agent.Call(ctx, agentproto.OpWipe, nil, nil, nil); err != nil {
		return fmt.Errorf("%w: wipe: %v", runtime.ErrNotReusable, err)
	}
	if err := quietNetwork(inst.Handle.Pid); err != nil {
		return fmt.Errorf("%w: %v", runtime.ErrNotReusable, err)
	}
	return nil
}

// Reroot implements runtime.Recycler.
func (r *Runtime) Reroot(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	h := inst.Handle
	if len(spec.Binds) > 0 || len(spec.Stateless) > 0 {
		return errors.New("container: reroot: binds and stateless sandboxes are not recycled")
	}
	// The pidfd pins the agent: setns through it cannot reach another
	// process that reused the pid.
	pidfd, err := unix.PidfdOpen(h.Pid, 0)
	if err != nil {
		return fmt.Errorf("%w: pidfd: %v", runtime.ErrGone, err)
	}
	defer unix.Close(pidfd)
	if !sameProcess(h.Pid, h.PidStart) {
		return fmt.Errorf("%w: agent pid %d", runtime.ErrGone, h.Pid)
	}
	id, err := confine.Reroot(pidfd, &confine.RerootConfig{Lowers: spec.Lowers, Upper: spec.Upper, Work: spec.Work})
	if err != nil {
		return err
	}
	req := &agentproto.RerootRequest{RootDev: id.Dev, RootIno: id.Ino}
	if err := inst.Agent.Call(ctx, agentproto.OpReroot, req, nil, nil); err != nil {
		return fmt.Errorf("container: reroot agent: %w", err)
	}
	return nil
}

// Resume implements runtime.Recycler.
func (r *Runtime) Resume(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	req := &agentproto.ResumeRequest{Env: spec.Env, User: spec.User}
	if err := inst.Agent.Call(ctx, agentproto.OpResume, req, nil, nil); err != nil {
		return fmt.Errorf("container: resume agent: %w", err)
	}
	return nil
}

// quietNetwork fails when the network namespace of pid holds any socket:
// all of the sandbox's processes are dead, so these would be connections
// in TIME_WAIT or closing. It reads the namespace's own counters
// (/proc/<pid>/net/sockstat and sockstat6: "inuse" and "tw" per protocol):
// /proc/<pid>/net/tcp walks the whole host's connection hash (262,144
// buckets here) on every read.
func quietNetwork(pid int) error {
	for _, f := range []string{"sockstat", "sockstat6"} {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/" + f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && f == "sockstat6" {
				continue // no IPv6
			}
			return err
		}
		if busy := busySockets(string(b)); busy != "" {
			return fmt.Errorf("sockets left in the network namespace (%s)", busy)
		}
	}
	return nil
}

// busySockets names the protocols of a sockstat file whose "inuse" or
// "tw" (TIME_WAIT) count is not 0; "" when none. The "sockets: used" line
// counts the whole host's.
func busySockets(sockstat string) string {
	var busy []string
	for _, line := range strings.Split(sockstat, "\n") {
		proto, rest, ok := strings.Cut(line, ":")
		if !ok || proto == "sockets" {
			continue
		}
		f := strings.Fields(rest)
		for i := 0; i+1 < len(f); i += 2 {
			if (f[i] == "inuse" || f[i] == "tw") && f[i+1] != "0" {
				busy = append(busy, proto+" "+f[i]+" "+f[i+1])
			}
		}
	}
	return strings.Join(busy, ", ")
}
