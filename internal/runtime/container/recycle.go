package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxnet"
)

// Wipe and Reroot reuse the container of a deleted sandbox. Wipe: the
// agent kills every other process, removes SysV IPC objects, forgets its
// sessions and checks its own attributes; the network namespace must hold
// no socket (a TIME_WAIT connection would show in the next sandbox's
// /proc/net/tcp and keep its port). Reroot: confine.Reroot pivots the
// sandbox into a fresh overlay (and removes its POSIX message queues), and
// the agent moves to it. Resume: the agent serves again, with the new
// sandbox's environment and user. Namespaces, cgroups and the agent stay: that
// is the saving. A networked container keeps its link and address too: Wipe
// parks its network (sandboxnet.Park), Resume gives it the next networked
// sandbox's policy (sandboxnet.Reassign) and resolver.

// recycleFDs are descriptors of one container's kernel objects that Wipe
// keeps from one sandbox to the next (opening them cost more than using
// them): its network namespace's sockstat files and a detached mount of its
// IPC namespace's message queues. Destroy closes them.
type recycleFDs struct {
	sockstat []*os.File
	mqueue   int
}

func (f *recycleFDs) close() {
	for _, s := range f.sockstat {
		s.Close()
	}
	if f.mqueue >= 0 {
		unix.Close(f.mqueue)
	}
}

// fdsFor returns the recycling descriptors of the container whose agent
// is behind h and pidfd, opening them the first time.
func (r *Runtime) fdsFor(h runtime.Handle, pidfd int) (*recycleFDs, error) {
	r.mu.Lock()
	f := r.recycle[h.Pid]
	r.mu.Unlock()
	if f != nil {
		return f, nil
	}
	f = &recycleFDs{mqueue: -1}
	for _, name := range []string{"sockstat", "sockstat6"} {
		s, err := os.Open("/proc/" + strconv.Itoa(h.Pid) + "/net/" + name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && name == "sockstat6" {
				continue // no IPv6
			}
			f.close()
			return nil, err
		}
		f.sockstat = append(f.sockstat, s)
	}
	mq, err := confine.OpenMessageQueues(pidfd)
	if err != nil {
		f.close()
		return nil, err
	}
	f.mqueue = mq
	// The descriptors must be the agent's: opened while it is alive.
	if !sameProcess(h.Pid, h.PidStart) {
		f.close()
		return nil, fmt.Errorf("%w: agent pid %d", runtime.ErrGone, h.Pid)
	}
	r.mu.Lock()
	if old := r.recycle[h.Pid]; old != nil {
		f.close()
		f = old
	} else {
		r.recycle[h.Pid] = f
	}
	r.mu.Unlock()
	return f, nil
}

// dropFDs closes the recycling descriptors of the container of agent pid.
func (r *Runtime) dropFDs(pid int) {
	r.mu.Lock()
	f := r.recycle[pid]
	delete(r.recycle, pid)
	r.mu.Unlock()
	if f != nil {
		f.close()
	}
}

// Wipe implements runtime.Recycler.
func (r *Runtime) Wipe(ctx context.Context, inst *runtime.Instance) error {
	h := inst.Handle
	if err := inst.Agent.Call(ctx, agentproto.OpWipe, nil, nil, nil); err != nil {
		return fmt.Errorf("%w: wipe: %v", runtime.ErrNotReusable, err)
	}
	pidfd, err := agentPidfd(h)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	fds, err := r.fdsFor(h, pidfd)
	if err != nil {
		return err
	}
	if err := quietNetwork(fds.sockstat); err != nil {
		return fmt.Errorf("%w: %v", runtime.ErrNotReusable, err)
	}
	if err := confine.EmptyMessageQueues(fds.mqueue); err != nil {
		return err
	}
	if h.Net != nil {
		// Its link and address stay; its policy, counters, connection
		// tracking and neighbours go (sandboxnet.Park).
		if err := r.net.Park(h.ID, h.Pid); err != nil {
			return fmt.Errorf("%w: %v", runtime.ErrNotReusable, err)
		}
	}
	return nil
}

// agentPidfd opens a pidfd of the agent behind h, checking that the pid is
// still the agent's. The pidfd pins the process: setns through it cannot
// reach another that reused the pid.
func agentPidfd(h runtime.Handle) (int, error) {
	pidfd, err := unix.PidfdOpen(h.Pid, 0)
	if err != nil {
		return -1, fmt.Errorf("%w: pidfd: %v", runtime.ErrGone, err)
	}
	if !sameProcess(h.Pid, h.PidStart) {
		unix.Close(pidfd)
		return -1, fmt.Errorf("%w: agent pid %d", runtime.ErrGone, h.Pid)
	}
	return pidfd, nil
}

// Reroot implements runtime.Recycler.
func (r *Runtime) Reroot(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	h := inst.Handle
	if len(spec.Binds) > 0 || len(spec.Stateless) > 0 {
		return errors.New("container: reroot: binds and stateless sandboxes are not recycled")
	}
	pidfd, err := agentPidfd(h)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	cfg := &confine.RerootConfig{
		Lowers: spec.Lowers, Upper: spec.Upper, Work: spec.Work, ShmMB: confine.ShmMBFor(spec.MemoryMB),
	}
	if h.IDBase != 0 && r.ids != nil {
		// The container keeps its user namespace and so its id range.
		if cfg.UsernsFD, err = r.ids.usernsOf(h.IDBase); err != nil {
			return err
		}
		cfg.IDBase = h.IDBase
		if err := confine.OwnRoot(spec.Upper, h.IDBase); err != nil {
			return err
		}
	}
	id, err := confine.Reroot(pidfd, cfg)
	if err != nil {
		return err
	}
	req := &agentproto.RerootRequest{RootDev: id.Dev, RootIno: id.Ino}
	if err := inst.Agent.Call(ctx, agentproto.OpReroot, req, nil, nil); err != nil {
		return fmt.Errorf("container: reroot agent: %w", err)
	}
	return nil
}

// Resume implements runtime.Recycler. A networked container (parked by
// Wipe) serves only a networked sandbox, with that sandbox's policy on
// its link; a container without a network, only a sandbox without one.
func (r *Runtime) Resume(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	h := &inst.Handle
	if (spec.Network != nil) != (h.Net != nil) {
		return fmt.Errorf("%w: a container with a network serves only a sandbox with one, and one without only one without", runtime.ErrNotReusable)
	}
	if spec.Network != nil {
		a, err := r.net.Reassign(h.ID, spec.Network.Egress, sandboxnet.AttachOptions{Group: spec.Network.Group, EgressRateMbit: spec.Network.EgressRateMbit})
		if err != nil {
			return fmt.Errorf("container: network: %w", err)
		}
		h.Net = &runtime.NetHandle{Address: a.Address.String(), Gateway: a.Gateway.String()}
	}
	req := &agentproto.ResumeRequest{Env: spec.Env, User: spec.User, Cwd: spec.Cwd}
	if err := inst.Agent.Call(ctx, agentproto.OpResume, req, nil, nil); err != nil {
		return fmt.Errorf("container: resume agent: %w", err)
	}
	if h.Net != nil {
		// The fresh root has the image's file.
		return runtime.WriteResolvConf(ctx, inst.Agent, h.Net.Gateway)
	}
	return nil
}

// quietNetwork fails when the network namespace of the sockstat files
// holds any socket: all of the sandbox's processes are dead, so these would
// be connections in TIME_WAIT or closing. It reads the namespace's own
// counters (/proc/<pid>/net/sockstat and sockstat6, "inuse" and "tw" per
// protocol, read again from the start each time): /proc/<pid>/net/tcp
// walks the whole host's connection hash (262,144 buckets here) on every
// read.
func quietNetwork(sockstat []*os.File) error {
	buf := make([]byte, 4096)
	for _, f := range sockstat {
		n, err := f.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if busy := busySockets(string(buf[:n])); busy != "" {
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
