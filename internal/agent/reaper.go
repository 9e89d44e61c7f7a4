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
//
// A child may be reaped before spawn has registered it (the fork is not done
// under the lock: a vfork-style fork blocks until the child has exec'd,
// hundreds of µs). Such statuses wait in unclaimed; spawn takes one only if
// it was reaped after the fork began, so a status of an earlier process that
// had the same pid is never mistaken for the new child's.
type reaper struct {
	mu        sync.Mutex
	waiters   map[int]chan exitInfo
	unclaimed map[int]exitInfo
}

// unclaimedTTL bounds how long an unregistered status is kept.
const unclaimedTTL = 2 * time.Second

func startReaper() *reaper {
	r := &reaper{waiters: make(map[int]chan exitInfo), unclaimed: make(map[int]exitInfo)}
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

// reapAll collects every exited child (wait4(-1, WNOHANG) until none).
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
		r.dispatch(pid, ws)
	}
}

func (r *reaper) dispatch(pid int, ws unix.WaitStatus) {
	{
		if ws.Stopped() || ws.Continued() {
			return
		}
		ei := exitInfo{status: ws, at: time.Now()}
		r.mu.Lock()
		ch := r.waiters[pid]
		if ch != nil {
			delete(r.waiters, pid)
		} else {
			r.unclaimed[pid] = ei
			if len(r.unclaimed) > 64 {
				for p, e := range r.unclaimed {
					if ei.at.Sub(e.at) > unclaimedTTL {
						delete(r.unclaimed, p)
					}
				}
			}
		}
		r.mu.Unlock()
		if ch != nil {
			ch <- ei
		}
	}
}

// spawn runs fork (which must start exactly one child and return its pid)
// and registers the child. The returned channel receives its exit.
func (r *reaper) spawn(fork func() (int, error)) (int, <-chan exitInfo, error) {
	began := time.Now()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitInfo, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if ei, ok := r.unclaimed[pid]; ok {
		delete(r.unclaimed, pid)
		if !ei.at.Before(began) {
			ch <- ei
			return pid, ch, nil
		}
	}
	r.waiters[pid] = ch
	return pid, ch, nil
}
