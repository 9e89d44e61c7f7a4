package elastic

import (
	"context"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// Agent is a sandbox's agent as WaitCommand uses it
// (*agentproto.Client).
type Agent interface {
	Call(ctx context.Context, op string, body any, out any, onChunk func(*agentproto.Response) error) error
	// Done is closed once the agent is gone.
	Done() <-chan struct{}
}

// WaitCommand returns once background command id has ended, its agent is
// gone (the sandbox stopped) or ctx ends: the wait behind a keep_cpu hold
// (the core also ends a trusted command's window after it).
func WaitCommand(ctx context.Context, agent Agent, id string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-agent.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	for ctx.Err() == nil {
		var st agentproto.ProcStatus
		err := agent.Call(ctx, agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: id, Wait: true}, &st, nil)
		if err != nil || !st.Running {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
