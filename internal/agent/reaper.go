package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// exitInfo is how a child ended.
type exitInfo struct {
	status unix.WaitStatus
	at     time.Time
}

// reaper is the only place that waits for children: one goroutine loops on
// SIGCHLD with wait4(-1, WNOHANG), hands statuses of registered pids to their
// waiters and silently reaps everything else (orphans reparented to us).
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exitInfo
}

func startReaper() *reaper {
	r := &reaper{waiters: make(map[int]chan exitInfo)}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		r.reapAll()
		for range ch {
			r.reapAll()
		}
	}()
	return r
}

func (r *reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		now := time.Now()
		r.mu.Lock()
		ch := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ch != nil {
			ch <- exitInfo{status: ws, at: now}
		}
	}
}

// spawn runs fork (which must start exactly one child and return its pid)
// while holding the registry lock, so the child's exit cannot be reaped
// before its waiter is registered. The returned channel receives its exit.
func (r *reaper) spawn(fork func() (int, error)) (int, <-chan exitInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitInfo, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}
