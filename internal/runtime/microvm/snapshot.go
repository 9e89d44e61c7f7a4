package microvm

// Pause as a memory snapshot. The edge pauses a sandbox with Freeze (QMP
// stop) and then Reclaim: the runtime writes the VM's memory and device
// state to a file (QMP getfd + migrate to "fd:") beside its writable
// disk and ends QEMU, so the host keeps no memory of it at all. Restore
// starts QEMU again with the same command line and "-incoming" from that
// file; the edge's Thaw (QMP cont) then continues the guest where it
// stopped, processes and all. The file is opened by the runtime and passed
// to QEMU as a descriptor both ways (QEMU may not spawn processes).
//
// The edge's agent connection survives the swap: Start and Attach hand it
// a vmConn, which the runtime moves to the new QEMU's socket (the guest's
// agent keeps its port open across the snapshot and serves the new
// connection as before). Outside a swap, an ended connection ends the
// vmConn, so a VM that dies is seen as dead.
//
// Locks: vmConn.mu and Runtime.mu are never held together.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/warrenhq/warren/internal/runtime"
)

// Files of a paused VM.
const (
	MemoryName = "vm-memory"   // beside the writable disk: the memory snapshot
	PausedName = "paused.json" // in the state directory: how to start it again
)

// pausedVM is PausedName's content.
type pausedVM struct {
	Args   []string `json:"args"`   // QEMU's arguments
	Memory string   `json:"memory"` // the snapshot file
}

var (
	_ runtime.Reclaimer = (*Runtime)(nil)
)

// Reclaim writes the frozen VM's memory to a file and ends its QEMU; it
// returns QEMU's resident memory before and after (0: it is gone).
func (r *Runtime) Reclaim(ctx context.Context, h runtime.Handle) (before, after int64, err error) {
	pid := r.pidOf(h)
	if pid == 0 {
		return 0, 0, runtime.ErrGone
	}
	stateDir := filepath.Dir(h.Socket)
	args, err := qemuArgs(stateDir, pid)
	if err != nil {
		return 0, 0, err
	}
	before = rssBytes(pid)
	disk, err := os.Readlink(filepath.Join(stateDir, DiskLink))
	if err != nil {
		return before, before, fmt.Errorf("microvm: pause: %w", err)
	}
	mem := filepath.Join(filepath.Dir(disk), MemoryName)
	t0 := time.Now()
	err = r.saveMemory(ctx, h, mem, false)
	if err != nil {
		_ = os.Remove(mem)
		return before, before, fmt.Errorf("microvm: pause: memory snapshot: %w (qemu: %q)", err, logTail(filepath.Join(stateDir, LogName), 300))
	}
	b, _ := json.Marshal(pausedVM{Args: withoutRAMFile(args), Memory: mem})
	if err := writeAtomic(filepath.Join(stateDir, PausedName), b); err != nil {
		_ = os.Remove(mem)
		return before, before, fmt.Errorf("microvm: pause: %w", err)
	}
	vc := r.conn(h.ID)
	if vc != nil {
		vc.beginMove()
	}
	_ = syscall9(pid)
	if err := r.waitGone(ctx, pid); err != nil {
		return before, before, err
	}
	r.log.Debug("microvm: paused to a memory snapshot", "id", h.ID, "rss", before, "took", time.Since(t0))
	return before, 0, nil
}

// saveMemory writes the (stopped) VM's memory and device state to mem: the
// file is opened here and passed to QEMU (QMP getfd), which may spawn
// nothing.
func (r *Runtime) saveMemory(ctx context.Context, h runtime.Handle, mem string, ignoreShared bool) error {
	mf, err := os.OpenFile(mem, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer mf.Close()
	return r.qmpSocket(h, func(mon *qmp.SocketMonitor, m *raw.Monitor) error {
		bw := int64(1) << 40 // no bandwidth limit: the VM is stopped
		if err := m.MigrateSetParameters(&raw.MigrateSetParameters{MaxBandwidth: &bw}); err != nil {
			return err
		}
		// A child of a fork had it on for its restore: its own RAM is
		// private and written in full.
		if err := setIgnoreShared(mon, ignoreShared); err != nil {
			return err
		}
		if _, err := mon.RunWithFile([]byte(`{"execute":"getfd","arguments":{"fdname":"snapshot"}}`), mf); err != nil {
			return fmt.Errorf("getfd: %w", err)
		}
		if err := m.Migrate("fd:snapshot", nil, nil, nil); err != nil {
			return err
		}
		return waitMigrated(ctx, m)
	})
}

// waitMigrated polls query-migrate until the migration is over.
func waitMigrated(ctx context.Context, m *raw.Monitor) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := m.QueryMigrate()
		if err != nil {
			return err
		}
		if info.Status != nil {
			switch *info.Status {
			case raw.MigrationStatusCompleted:
				return nil
			case raw.MigrationStatusFailed, raw.MigrationStatusCancelled:
				desc := ""
				if info.ErrorDesc != nil {
					desc = *info.ErrorDesc
				}
				return fmt.Errorf("migration %s: %s", info.Status, desc)
			}
		}
		if time.Now().After(deadline) {
			return errors.New("migration did not finish in 2 minutes")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Restore starts a VM paused to a memory snapshot again (still paused:
// Thaw continues it) and moves the edge's connection to it. A VM paused
// without a snapshot (QMP stop only) needs nothing.
func (r *Runtime) Restore(ctx context.Context, h runtime.Handle, memoryMB int64) error {
	stateDir := filepath.Dir(h.Socket)
	b, err := os.ReadFile(filepath.Join(stateDir, PausedName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("microvm: resume: %w", err)
	}
	var p pausedVM
	if err := json.Unmarshal(b, &p); err != nil || len(p.Args) == 0 {
		return fmt.Errorf("microvm: resume: malformed %s: %v", PausedName, err)
	}
	vc := r.conn(h.ID)
	if r.pidOf(h) == 0 {
		if err := r.restart(ctx, h, p); err != nil {
			if vc != nil {
				vc.fail(err)
			}
			return err
		}
	}
	if vc != nil {
		c, err := r.dial(ctx, h)
		if err != nil {
			vc.fail(err)
			return err
		}
		vc.swap(c)
	}
	_ = os.Remove(filepath.Join(stateDir, PausedName))
	_ = os.Remove(p.Memory)
	return nil
}

// restart starts QEMU from p and waits until it has read the snapshot.
func (r *Runtime) restart(ctx context.Context, h runtime.Handle, p pausedVM) error {
	t0 := time.Now()
	nh, err := r.startIncoming(ctx, h, p.Args, p.Memory, false, nil)
	if err != nil {
		return fmt.Errorf("microvm: resume: %w", err)
	}
	r.log.Debug("microvm: restored from a memory snapshot", "id", h.ID, "pid", nh.Pid, "took", time.Since(t0))
	return nil
}

// startIncoming starts QEMU with args reading the memory snapshot mem, in
// h's cgroup, and waits until it has read it; the VM is then paused (QMP
// cont runs it). It returns h with the new QEMU's pid. QEMU starts with
// "-incoming defer" and gets the snapshot over QMP (getfd): it reads it
// once it runs unprivileged (spawn.go). With ignoreShared, the snapshot
// leaves out the RAM that args map from a file (fork.go), ram when it is
// the shared RAM's memfd (ramfile.go).
func (r *Runtime) startIncoming(ctx context.Context, h runtime.Handle, args []string, mem string, ignoreShared bool, ram *os.File) (runtime.Handle, error) {
	mf, err := os.Open(mem)
	if err != nil {
		return h, err
	}
	defer mf.Close()
	args = append(append([]string(nil), args...), "-incoming", "defer")
	cmd, err := r.spawn(filepath.Dir(h.Socket), h.Cgroup, args, ram)
	if err != nil {
		return h, err
	}
	st, err := pidStart(cmd.Process.Pid)
	if err != nil {
		return h, err
	}
	nh := h
	nh.Pid, nh.PidStart = cmd.Process.Pid, st
	deadline := time.Now().Add(2 * time.Minute)
	started := false
	for {
		var status raw.RunState
		err := r.qmpSocket(nh, func(mon *qmp.SocketMonitor, m *raw.Monitor) error {
			if !started {
				if err := setIgnoreShared(mon, ignoreShared); err != nil {
					return err
				}
				if _, err := mon.RunWithFile([]byte(`{"execute":"getfd","arguments":{"fdname":"snapshot"}}`), mf); err != nil {
					return fmt.Errorf("getfd: %w", err)
				}
				if err := m.MigrateIncoming("fd:snapshot"); err != nil {
					return err
				}
				started = true
			}
			s, err := m.QueryStatus()
			status = s.Status
			return err
		})
		if err == nil && status != raw.RunStateInmigrate {
			return nh, nil
		}
		if !r.alive(nh) {
			return nh, fmt.Errorf("qemu exited (log: %q): %w", logTail(filepath.Join(filepath.Dir(h.Socket), LogName), 300), runtime.ErrGone)
		}
		if time.Now().After(deadline) {
			return nh, errors.New("the snapshot was not read in 2 minutes")
		}
		select {
		case <-ctx.Done():
			return nh, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// setIgnoreShared turns QEMU's x-ignore-shared migration capability on or
// off: with it, a snapshot leaves out RAM mapped shared from a file. (The
// QMP library's capability enum lacks it: the command goes through the
// library's Run as it is.)
func setIgnoreShared(mon *qmp.SocketMonitor, on bool) error {
	cmd := fmt.Sprintf(`{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"x-ignore-shared","state":%t}]}}`, on)
	if _, err := mon.Run([]byte(cmd)); err != nil {
		return fmt.Errorf("x-ignore-shared: %w", err)
	}
	return nil
}

// Prefetch has nothing to do: a restored VM's memory is all read.
func (r *Runtime) Prefetch(ctx context.Context, h runtime.Handle, rest bool) (int64, error) {
	return 0, nil
}

// rssBytes is pid's resident memory (0 when unknown).
func rssBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n * int64(os.Getpagesize())
}

func writeAtomic(p string, b []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// vmConn is the edge's connection to a VM's agent; it outlives the QEMU
// process behind it across a memory snapshot.
type vmConn struct {
	mu     sync.Mutex
	cond   *sync.Cond
	cur    net.Conn
	gen    int
	moving bool  // QEMU is being replaced: the old connection's end is not the VM's
	err    error // set: the connection is over
	onEnd  func(*vmConn)
}

func newVMConn(c net.Conn, onEnd func(*vmConn)) *vmConn {
	v := &vmConn{cur: c, onEnd: onEnd}
	v.cond = sync.NewCond(&v.mu)
	return v
}

// current waits out a move and returns the connection to use.
func (v *vmConn) current() (net.Conn, int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for v.moving && v.err == nil {
		v.cond.Wait()
	}
	if v.err != nil {
		return nil, 0, v.err
	}
	return v.cur, v.gen, nil
}

// retry reports whether an error of connection gen came from a move.
func (v *vmConn) retry(gen int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err == nil && (v.moving || v.gen != gen)
}

func (v *vmConn) Read(p []byte) (int, error) {
	for {
		c, gen, err := v.current()
		if err != nil {
			return 0, err
		}
		n, err := c.Read(p)
		if err != nil && n == 0 && v.retry(gen) {
			continue
		}
		return n, err
	}
}

func (v *vmConn) Write(p []byte) (int, error) {
	c, _, err := v.current()
	if err != nil {
		return 0, err
	}
	return c.Write(p)
}

func (v *vmConn) beginMove() {
	v.mu.Lock()
	v.moving = true
	v.mu.Unlock()
}

// swap makes c the connection and ends the move.
func (v *vmConn) swap(c net.Conn) {
	v.mu.Lock()
	old := v.cur
	if v.err != nil {
		v.mu.Unlock()
		c.Close()
		return
	}
	v.cur, v.gen, v.moving = c, v.gen+1, false
	v.cond.Broadcast()
	v.mu.Unlock()
	old.Close()
}

// fail ends the connection with err (a restore that failed).
func (v *vmConn) fail(err error) {
	v.mu.Lock()
	if v.err == nil {
		v.err = err
	}
	v.moving = false
	v.cond.Broadcast()
	c := v.cur
	v.mu.Unlock()
	c.Close()
}

func (v *vmConn) Close() error {
	v.mu.Lock()
	if v.err == nil {
		v.err = net.ErrClosed
	}
	v.cond.Broadcast()
	c := v.cur
	v.mu.Unlock()
	if v.onEnd != nil {
		v.onEnd(v)
	}
	return c.Close()
}

func (v *vmConn) LocalAddr() net.Addr  { return v.cur.LocalAddr() }
func (v *vmConn) RemoteAddr() net.Addr { return v.cur.RemoteAddr() }
func (v *vmConn) SetDeadline(t time.Time) error {
	c, _, err := v.current()
	if err != nil {
		return err
	}
	return c.SetDeadline(t)
}
func (v *vmConn) SetReadDeadline(t time.Time) error {
	c, _, err := v.current()
	if err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}
func (v *vmConn) SetWriteDeadline(t time.Time) error {
	c, _, err := v.current()
	if err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}
