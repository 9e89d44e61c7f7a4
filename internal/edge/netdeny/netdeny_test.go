package netdeny

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

type fakeSandbox struct {
	mu      sync.Mutex
	net     Net
	audited []api.NetworkDenialRecord
}

func (f *fakeSandbox) Net() Net {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.net
}

func (f *fakeSandbox) Audit(recs ...api.NetworkDenialRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.audited = append(f.audited, recs...)
}

func (f *fakeSandbox) auditedN() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.audited)
}

type fakeHost struct {
	publishing bool
	events     []api.Event
	ids        []string
}

func (h *fakeHost) Node() string     { return "n1" }
func (h *fakeHost) Publishing() bool { return h.publishing }
func (h *fakeHost) Publish(ev api.Event, id string) {
	h.events, h.ids = append(h.events, ev), append(h.ids, id)
}

// fakeReporter is the kernel's record: counts by destination, protocol
// and reason.
type fakeReporter struct {
	mu    sync.Mutex
	dd    []api.NetworkDenial
	err   error
	reads int
}

func (r *fakeReporter) NetworkDenied(runtime.Handle) (map[string]int64, error) { return nil, nil }
func (r *fakeReporter) NetworkDeniedDestinations(runtime.Handle) ([]api.NetworkDenial, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	return append([]api.NetworkDenial(nil), r.dd...), r.err
}

func (r *fakeReporter) set(dd ...api.NetworkDenial) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dd = dd
}

func newLog(publishing bool) (*Log, *fakeHost, *fakeReporter) {
	h := &fakeHost{publishing: publishing}
	l := New(h, nil)
	if l.nr != nil {
		panic("a nil runtime reports")
	}
	nr := &fakeReporter{}
	l.nr = nr
	return l, h, nr
}

func networked(id string, step int64) *fakeSandbox {
	return &fakeSandbox{net: Net{ID: id, Project: "p", Step: step, Handle: &runtime.Handle{ID: id}}}
}

// TestLogBounds: a sandbox's log keeps the newest api.MaxDenialLog
// entries, oldest first, and counts what it dropped; the node's totals
// count everything, by reason, and outlive a forgotten log.
func TestLogBounds(t *testing.T) {
	l, _, _ := newLog(false)
	if l.Totals() != nil {
		t.Fatal("totals before any refusal")
	}
	sb := networked("sb-1", 2)
	n := api.MaxDenialLog + 5
	for i := range n {
		reason := "private"
		if i%2 == 1 {
			reason = "not_allowed"
		}
		l.Record(sb, api.NetworkDenialRecord{Destination: fmt.Sprintf("h%d.example", i), Protocol: "dns", Reason: reason, Count: 1})
	}
	out, err := l.Read(sb, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Denials) != api.MaxDenialLog || out.Dropped != 5 || out.ID != "sb-1" {
		t.Fatalf("kept %d, dropped %d, id %q; want %d, 5, sb-1", len(out.Denials), out.Dropped, out.ID, api.MaxDenialLog)
	}
	if out.Denials[0].Destination != "h5.example" || out.Denials[len(out.Denials)-1].Destination != fmt.Sprintf("h%d.example", n-1) {
		t.Fatalf("oldest %q, newest %q", out.Denials[0].Destination, out.Denials[len(out.Denials)-1].Destination)
	}
	if out.Denials[0].Step != 2 {
		t.Fatalf("step %d, want the sandbox's 2", out.Denials[0].Step)
	}
	if sb.auditedN() != n {
		t.Fatalf("audited %d, want %d", sb.auditedN(), n)
	}
	want := map[string]int64{"private": int64(n+1) / 2, "not_allowed": int64(n) / 2}
	l.Forget("sb-1")
	if got := l.Totals(); !reflect.DeepEqual(got, want) {
		t.Fatalf("totals %v, want %v", got, want)
	}
	out, err = l.Read(networked("sb-1", 0), "sb-1")
	if err != nil || len(out.Denials) != 0 || out.Denials == nil || out.Dropped != 0 {
		t.Fatalf("after forget: %+v %v", out, err)
	}
}

// TestPoll: an entry is a destination whose kernel count grew, with the
// packets since the last read (names are the resolver's, not the
// kernel's); a sandbox without a networked container is not read.
func TestPoll(t *testing.T) {
	l, _, nr := newLog(false)
	sb := networked("sb-1", 4)
	nr.set(
		api.NetworkDenial{Destination: "10.0.0.1:443", Protocol: "tcp", Reason: "private", Count: 3},
		api.NetworkDenial{Destination: "evil.example", Protocol: "dns", Reason: "not_allowed", Count: 9},
		api.NetworkDenial{Destination: "10.0.0.2:53", Protocol: "udp", Reason: "not_allowed", Count: 1},
	)
	if err := l.Poll(sb); err != nil {
		t.Fatal(err)
	}
	nr.set(
		api.NetworkDenial{Destination: "10.0.0.1:443", Protocol: "tcp", Reason: "private", Count: 5},
		api.NetworkDenial{Destination: "evil.example", Protocol: "dns", Reason: "not_allowed", Count: 12},
		api.NetworkDenial{Destination: "10.0.0.2:53", Protocol: "udp", Reason: "not_allowed", Count: 1},
	)
	out, err := l.Read(sb, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	type ent struct {
		dst   string
		count int64
	}
	var got []ent
	for _, r := range out.Denials {
		if r.Step != 4 || r.Time.IsZero() {
			t.Fatalf("entry %+v: want step 4 and a time", r)
		}
		got = append(got, ent{r.Destination, r.Count})
	}
	want := []ent{{"10.0.0.1:443", 3}, {"10.0.0.2:53", 1}, {"10.0.0.1:443", 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	if !reflect.DeepEqual(sb.audited, out.Denials) {
		t.Fatalf("audited %+v, want the log's entries", sb.audited)
	}
	reads := nr.reads
	idle := &fakeSandbox{net: Net{ID: "sb-2"}} // no networked container
	if err := l.Poll(idle); err != nil || nr.reads != reads {
		t.Fatalf("a sandbox without a network: %v, %d reads", err, nr.reads-reads)
	}
}

// TestReadError: a kernel record that cannot be read is a conflict
// naming the sandbox; a runtime without one logs names only.
func TestReadError(t *testing.T) {
	l, _, nr := newLog(false)
	nr.err = errors.New("netlink: busy")
	_, err := l.Read(networked("sb-1", 0), "sb-1")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || ae.Message != "sandbox sb-1: network record cannot be read now: netlink: busy" {
		t.Fatalf("read error: %v", err)
	}
	plain := New(&fakeHost{}, nil)
	if err := plain.Poll(networked("sb-1", 0)); err != nil {
		t.Fatalf("no reporter: %v", err)
	}
}

// TestEvents: a sandbox publishes its pending refusals at most once per
// EventEvery, then all that were pending; nothing while the node
// publishes no events.
func TestEvents(t *testing.T) {
	l, h, _ := newLog(true)
	sb := networked("sb-1", 0)
	l.Record(sb, api.NetworkDenialRecord{Destination: "a.example", Protocol: "dns", Reason: "not_allowed", Count: 1})
	l.Record(sb, api.NetworkDenialRecord{Destination: "b.example", Protocol: "dns", Reason: "not_allowed", Count: 1})
	l.Record(sb, api.NetworkDenialRecord{Destination: "c.example", Protocol: "dns", Reason: "not_allowed", Count: 1})
	if len(h.events) != 1 {
		t.Fatalf("%d events within %v, want 1", len(h.events), EventEvery)
	}
	ev := h.events[0]
	if ev.Type != api.EventSandboxNetworkDenied || ev.Node != "n1" || ev.Sandbox != "sb-1" || ev.Project != "p" ||
		ev.Message != "1 refused; the last: dns a.example (not_allowed)" || !strings.HasPrefix(h.ids[0], "denied-sb-1-") {
		t.Fatalf("event %+v id %q", ev, h.ids[0])
	}
	l.maybeEvent(sb)
	if len(h.events) != 1 {
		t.Fatal("published again within EventEvery")
	}
	l.mu.Lock()
	l.bySB["sb-1"].last = time.Now().Add(-EventEvery)
	l.mu.Unlock()
	l.maybeEvent(sb)
	if len(h.events) != 2 || h.events[1].Message != "2 refused; the last: dns c.example (not_allowed)" {
		t.Fatalf("pending event: %+v", h.events)
	}
	l.mu.Lock()
	l.bySB["sb-1"].last = time.Time{}
	l.mu.Unlock()
	l.maybeEvent(sb)
	if len(h.events) != 2 {
		t.Fatal("an event with nothing pending")
	}

	quiet, qh, _ := newLog(false)
	quiet.Record(sb, api.NetworkDenialRecord{Destination: "a.example", Protocol: "dns", Reason: "not_allowed", Count: 1})
	qh.publishing = true
	quiet.maybeEvent(sb)
	if len(qh.events) != 1 || !strings.HasPrefix(qh.events[0].Message, "1 refused") {
		t.Fatalf("refusals kept while the node published nothing: %+v", qh.events)
	}
}

// TestRun: the loop reads every networked sandbox it is given, until its
// context ends.
func TestRun(t *testing.T) {
	l, _, nr := newLog(false)
	l.every = 5 * time.Millisecond
	a, b := networked("sb-a", 0), networked("sb-b", 0)
	nr.set(api.NetworkDenial{Destination: "10.0.0.1:80", Protocol: "tcp", Reason: "private", Count: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx, func() []Sandbox { return []Sandbox{a, b} })
	}()
	deadline := time.Now().Add(5 * time.Second)
	for a.auditedN() == 0 || b.auditedN() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the loop read nothing")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop outlived its context")
	}
	if a.auditedN() != 1 || b.auditedN() != 1 {
		t.Fatalf("a count that did not grow was logged again: %d, %d", a.auditedN(), b.auditedN())
	}
}
