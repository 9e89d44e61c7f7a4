package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketLost holds what the watchers reported lost: one key per node and
// down episode ("<node>.<last heartbeat, unix seconds>"), its value the
// node's roster at that moment (one "id project" line per sandbox). It is
// written only when a node goes down, never on the create path. A node
// that comes back destroys the sandboxes listed for it instead of adopting
// them (as a kubelet kills the pods deleted while it was away).
const BucketLost = "warren-lost"

// LostMaxAge is how long a lost record is kept: as long as the event
// stream keeps its sandbox.lost events. A node away for longer adopts
// what it finds.
const LostMaxAge = EventsMaxAge

// Lost is the lost-sandbox bucket.
type Lost struct{ kv jetstream.KeyValue }

// OpenLost opens (creating when missing) the lost-sandbox bucket.
func (c *Conn) OpenLost(ctx context.Context) (*Lost, error) {
	kv, err := c.KeyValue(ctx, BucketLost, LostMaxAge)
	if err != nil {
		return nil, err
	}
	return &Lost{kv: kv}, nil
}

// Record stores the sandboxes (roster lines) reported lost when node went
// down. Watchers that record the same episode write the same key.
func (l *Lost) Record(ctx context.Context, node string, epoch int64, roster []byte) error {
	if _, err := l.kv.Put(ctx, node+"."+strconv.FormatInt(epoch, 10), roster); err != nil {
		return fmt.Errorf("bus: record lost sandboxes of %s: %w", node, err)
	}
	return nil
}

// ParseRoster reads roster lines ("id project") into id -> project.
func ParseRoster(b []byte, into map[string]string) {
	for _, line := range strings.Split(string(b), "\n") {
		id, project, _ := strings.Cut(line, " ")
		if id != "" {
			into[id] = project
		}
	}
}

// Of returns every sandbox recorded lost on node (id -> project).
func (l *Lost) Of(ctx context.Context, node string) (map[string]string, error) {
	out := map[string]string{}
	w, err := l.kv.Watch(ctx, node+".*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("bus: lost sandboxes of %s: %w", node, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok || e == nil {
				return out, nil
			}
			ParseRoster(e.Value(), out)
		}
	}
}

// Watch calls fn with the sandboxes recorded lost on node: once with
// every stored record (initial true) before it returns, then with each
// record written later, from a goroutine, until ctx ends.
func (l *Lost) Watch(ctx context.Context, node string, fn func(lost map[string]string, initial bool)) error {
	// Starting the watch can fail for a while when a NATS server of the
	// cluster just died (its streams elect new leaders): retry, as the
	// other start-up requests do.
	var w jetstream.KeyWatcher
	err := RetryStartup(ctx, func(context.Context) error {
		var err error
		w, err = l.kv.Watch(ctx, node+".*", jetstream.IgnoreDeletes())
		return err
	})
	if err != nil {
		return fmt.Errorf("bus: watch lost sandboxes of %s: %w", node, err)
	}
	initial := map[string]string{}
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			_ = w.Stop()
			return ctx.Err()
		case <-timeout.C:
			_ = w.Stop()
			return errors.New("bus: watch lost sandboxes: the stored records did not arrive in 30 s")
		case e, ok := <-w.Updates():
			if !ok {
				_ = w.Stop()
				return errors.New("bus: watch lost sandboxes: watcher closed")
			}
			if e == nil {
				done = true
				break
			}
			ParseRoster(e.Value(), initial)
		}
	}
	fn(initial, true)
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				m := map[string]string{}
				ParseRoster(e.Value(), m)
				if len(m) > 0 {
					fn(m, false)
				}
			}
		}
	}()
	return nil
}
