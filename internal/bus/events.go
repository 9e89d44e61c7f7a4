package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
)

// EventsMaxAge is how long the event stream keeps events.
const EventsMaxAge = 7 * 24 * time.Hour

// Events is the cluster's event stream (node down/up, sandboxes lost).
// Several watchers may publish the same event; a message id per event makes
// JetStream keep one copy.
type Events struct {
	c      *Conn
	stream jetstream.Stream
}

// OpenEvents opens (creating when missing) the event stream.
func (c *Conn) OpenEvents(ctx context.Context) (*Events, error) {
	cfg := jetstream.StreamConfig{
		Name: StreamEvents, Subjects: []string{SubjectEvents + ".>"}, Storage: jetstream.FileStorage,
		Replicas: c.replicas(), MaxAge: EventsMaxAge, Duplicates: 10 * time.Minute, MaxMsgs: 10_000_000,
	}
	st, err := openOrCreate(ctx, c,
		func(ctx context.Context) (jetstream.Stream, error) { return c.js.Stream(ctx, StreamEvents) },
		func(ctx context.Context) (jetstream.Stream, error) { return c.js.CreateStream(ctx, cfg) },
		jetstream.ErrStreamNameAlreadyInUse)
	if err != nil {
		return nil, fmt.Errorf("bus: stream %s: %w", StreamEvents, err)
	}
	return &Events{c: c, stream: st}, nil
}

// Publish appends ev once per id (duplicates within ten minutes are dropped).
func (e *Events) Publish(ctx context.Context, ev api.Event, id string) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	m := nats.NewMsg(SubjectEvents + "." + ev.Type)
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, id)
	_, err = e.c.js.PublishMsg(ctx, m)
	return err
}

// Read returns up to limit events after seq after, waiting at most wait
// for the first one.
func (e *Events) Read(ctx context.Context, after uint64, limit int, wait time.Duration) ([]api.Event, error) {
	deadline := time.Now().Add(wait)
	out := []api.Event{}
	for {
		info, err := e.stream.Info(ctx)
		if err != nil {
			return nil, err
		}
		first, last := info.State.FirstSeq, info.State.LastSeq
		seq := after + 1
		if seq < first {
			seq = first
		}
		for ; seq <= last && len(out) < limit; seq++ {
			m, err := e.stream.GetMsg(ctx, seq)
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					continue
				}
				return out, err
			}
			var ev api.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				continue
			}
			ev.Seq = m.Sequence
			out = append(out, ev)
		}
		if len(out) > 0 || time.Now().After(deadline) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Follow delivers every event after seq after, in order, to fn as it is
// appended, until ctx ends or fn fails. idle, when set, is called every
// idleEvery (a stream keeps its connection alive with it).
// It reads through an ordered consumer: nothing durable is created.
func (e *Events) Follow(ctx context.Context, after uint64, idleEvery time.Duration, idle func() error, fn func(api.Event) error) error {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: time.Minute}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := e.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("bus: follow events: %w", err)
	}
	msgs := make(chan jetstream.Msg, 256)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return fmt.Errorf("bus: follow events: %w", err)
	}
	defer cc.Stop()
	if idleEvery <= 0 {
		idleEvery = time.Hour
	}
	t := time.NewTimer(idleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if idle != nil {
				if err := idle(); err != nil {
					return err
				}
			}
			t.Reset(idleEvery)
		case m := <-msgs:
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			var ev api.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				continue
			}
			ev.Seq = md.Sequence.Stream
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
}
