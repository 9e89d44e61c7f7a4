package upload

import (
	"context"
	"sync"

	"github.com/warrenhq/warren/internal/agentproto"
)

// writes are the agent writes of one upload in flight: at most depth at
// once, and one more buffer being filled from the upload meanwhile. Every
// write is waited for before the upload ends or fails, so none outlives
// the removal of the temporary file.
type writes struct {
	free  chan []byte   // buffers not in use
	slots chan struct{} // one per write in flight
	wg    sync.WaitGroup
	mu    sync.Mutex
	first error // the first write that failed
}

func newWrites(size, depth int) *writes {
	u := &writes{free: make(chan []byte, depth+1), slots: make(chan struct{}, depth)}
	for range depth + 1 {
		u.free <- make([]byte, size)
	}
	return u
}

// buffer waits for a buffer no write uses.
func (u *writes) buffer() []byte { return <-u.free }

func (u *writes) release(buf []byte) { u.free <- buf }

// start runs write once a slot is free; its buffer is released after it.
func (u *writes) start(write func() error, buf []byte) {
	u.slots <- struct{}{}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		err := write()
		if err != nil {
			u.mu.Lock()
			if u.first == nil {
				u.first = err
			}
			u.mu.Unlock()
		}
		<-u.slots
		u.release(buf)
	}()
}

func (u *writes) wait() { u.wg.Wait() }

func (u *writes) err() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.first
}

// writeChunk writes one chunk of an upload: recorded in a trajectory
// sandbox, else straight to the agent (raw when it takes a payload); at
// its offset at (pwrite) unless at is negative.
//
// A write is not cancelled with its upload: a short one that the agent
// finished after the edge stopped waiting would recreate the temporary
// file that the upload's failure removes.
func writeChunk(ctx context.Context, sb Sandbox, w *Write, at int64) error {
	ctx = context.WithoutCancel(ctx)
	if sb.Recorded() {
		return sb.Record(ctx, w)
	}
	agent, release, err := sb.Acquire()
	if err != nil {
		return err
	}
	defer release()
	req := &agentproto.WriteRequest{Path: w.Path, Mode: w.Mode, Append: w.Append}
	if at >= 0 {
		req.At, req.Offset, req.Append = true, at, false
	}
	if agent.Proto() >= agentproto.ProtoPayload {
		err = agent.CallPayload(ctx, agentproto.OpFileWrite, req, w.Data, nil, nil)
	} else {
		for data := w.Data; err == nil && (len(data) > 0 || !req.Append); {
			c := data[:min(len(data), ChunkJSON)]
			req.Data = c
			err = agent.Call(ctx, agentproto.OpFileWrite, req, nil, nil)
			req.Append, data = true, data[len(c):]
		}
	}
	if err != nil {
		return sb.AgentError(err)
	}
	return nil
}
