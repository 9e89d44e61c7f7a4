package container

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
	"github.com/warrenhq/warren/internal/runtime"
)

// Recycle reuses the container of a deleted sandbox: the agent wipes it
// (every other process killed, SysV IPC removed, its sessions forgotten,
// its own attributes checked), the network namespace must hold no socket
// (a TIME_WAIT connection would show in the next sandbox's /proc/net/tcp
// and keep its port), then confine.Reroot pivots the sandbox into a fresh
// overlay (and removes its POSIX message queues) and the agent switches to
// it. Namespaces, cgroups and the agent stay: that is the saving.
func (r *Runtime) Recycle(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	h := inst.Handle
	if len(spec.Binds) > 0 || len(spec.Stateless) > 0 {
		return fmt.Errorf("%w: binds and stateless sandboxes are not recycled", runtime.ErrNotReusable)
	}
	if err := inst.Agent.Call(ctx, agentproto.OpWipe, nil, nil, nil); err != nil {
		return fmt.Errorf("%w: wipe: %v", runtime.ErrNotReusable, err)
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
	if err := quietNetwork(h.Pid); err != nil {
		return fmt.Errorf("%w: %v", runtime.ErrNotReusable, err)
	}
	id, err := confine.Reroot(pidfd, &confine.RerootConfig{Lowers: spec.Lowers, Upper: spec.Upper, Work: spec.Work})
	if err != nil {
		return err
	}
	req := &agentproto.RerootRequest{RootDev: id.Dev, RootIno: id.Ino, Env: spec.Env, User: spec.User}
	if err := inst.Agent.Call(ctx, agentproto.OpReroot, req, nil, nil); err != nil {
		return fmt.Errorf("container: reroot agent: %w", err)
	}
	return nil
}

// quietNetwork fails when the network namespace of pid holds any TCP
// socket (all of the sandbox's processes are dead, so these are
// connections in TIME_WAIT or closing).
func quietNetwork(pid int) error {
	for _, f := range []string{"tcp", "tcp6"} {
		n, err := countLines("/proc/" + strconv.Itoa(pid) + "/net/" + f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && f == "tcp6" {
				continue // no IPv6
			}
			return err
		}
		if n > 1 {
			return fmt.Errorf("%d %s sockets left in the network namespace", n-1, f)
		}
	}
	return nil
}

func countLines(p string) (int, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
	}
	return n, sc.Err()
}
