package confine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// DialLoopback connects to port on the loopback of the network namespace
// of the process behind pidfd (a sandbox's agent): 127.0.0.1, then ::1
// when nothing listens there. The socket is made on an OS thread that has
// entered that namespace alone (setns CLONE_NEWNET) and is connected from
// there; once made, a socket belongs to its namespace for good, so the
// thread goes back to the edge's namespace right after, and the connection
// is an ordinary one of Go's poller (deadlines, CloseWrite, backpressure).
// A thread that cannot go back ends with its goroutine (it is never given
// back to Go's scheduler).
func DialLoopback(ctx context.Context, pidfd, port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		c, err, back := dialIn(ctx, pidfd, port)
		if back {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// dialIn runs on a locked thread; back says whether the thread is in the
// edge's own network namespace again.
func dialIn(ctx context.Context, pidfd, port int) (net.Conn, error, bool) {
	home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("confine: open own network namespace: %w", err), true
	}
	defer unix.Close(home)
	var st unix.Stat_t
	if err := unix.Fstat(home, &st); err != nil {
		return nil, err, true
	}
	if err := unix.Setns(pidfd, unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("confine: enter the sandbox's network namespace: %w", err), true
	}
	c, derr := dialLoopback(ctx, port)
	if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
		if c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("confine: back to own network namespace: %w", err), false
	}
	var now unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &now); err != nil || now.Ino != st.Ino {
		if c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("confine: not back in own network namespace (%v)", err), false
	}
	return c, derr, true
}

func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	p := strconv.Itoa(port)
	c, err := d.DialContext(ctx, "tcp4", "127.0.0.1:"+p)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return c, err
	}
	if c6, err6 := d.DialContext(ctx, "tcp6", "[::1]:"+p); err6 == nil {
		return c6, nil
	}
	return nil, err
}
