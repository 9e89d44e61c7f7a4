package container

import (
	"context"
	"net"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/confine"
	"github.com/warrenhq/warren/internal/runtime"
)

// DialPort implements runtime.PortDialer: a connection to port on the
// sandbox's loopback, made from inside its network namespace (entered
// through a pidfd of its agent, which pins the process against pid reuse).
func (r *Runtime) DialPort(ctx context.Context, h runtime.Handle, port int) (net.Conn, error) {
	pidfd, err := agentPidfd(h)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pidfd)
	return confine.DialLoopback(ctx, pidfd, port)
}
