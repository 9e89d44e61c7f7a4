package audit

import (
	"context"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// tick returns the time now, a moment after the last call's.
func tick() time.Time {
	time.Sleep(2 * time.Millisecond)
	return time.Now()
}

// TestTrustedWindows: a running trusted command covers from its start
// on; a window that ended covers its span only; nested commands make one
// window; the four newest ended windows are kept.
func TestTrustedWindows(t *testing.T) {
	var w trustedWindows
	before := tick()
	if w.covers(before) {
		t.Fatal("no command ran: covered")
	}
	tick()
	w.begin()
	in1 := tick()
	if !w.covers(in1) || !w.covers(time.Now()) {
		t.Fatal("a running command does not cover now")
	}
	if w.covers(before) {
		t.Fatal("a running command covers a time before it began")
	}
	w.begin() // a second one, inside the first's window
	w.end()
	in2 := tick()
	if !w.covers(in2) {
		t.Fatal("one of two commands ended: the window closed")
	}
	w.end()
	after := tick()
	if !w.covers(in1) || !w.covers(in2) {
		t.Fatal("an ended window does not cover its span")
	}
	if w.covers(after) || w.covers(before) {
		t.Fatal("an ended window covers times outside it")
	}
	var inside []time.Time
	for range 4 {
		w.begin()
		inside = append(inside, tick())
		w.end()
		tick()
	}
	if w.covers(in1) {
		t.Fatal("the oldest of five ended windows is still kept")
	}
	for i, at := range inside {
		if !w.covers(at) {
			t.Fatalf("window %d of the newest four: not covered", i)
		}
	}
}

// TestEnterCancelAll: a hook cancels every operation registered, with a
// cause KilledByPolicy tells; an operation that left is not cancelled,
// and one that merely ended was not killed by a policy.
func TestEnterCancelAll(t *testing.T) {
	var s State
	ctx1, leave1 := s.Enter(context.Background())
	ctx2, leave2 := s.Enter(context.Background())
	ctx3, leave3 := s.Enter(context.Background())
	leave3()
	if KilledByPolicy(ctx3) || ctx3.Err() == nil {
		t.Fatalf("left operation: killed %v, err %v; want false, cancelled", KilledByPolicy(ctx3), ctx3.Err())
	}
	if KilledByPolicy(ctx1) {
		t.Fatal("running operation killed before any hook")
	}
	if n := s.steps.cancelAll(); n != 2 {
		t.Fatalf("cancelled %d, want 2", n)
	}
	if !KilledByPolicy(ctx1) || !KilledByPolicy(ctx2) {
		t.Fatal("cancelled operations not killed by policy")
	}
	leave1()
	leave2()
	if n := s.steps.cancelAll(); n != 0 {
		t.Fatalf("after leaving: cancelled %d, want 0", n)
	}
}

// TestSetPolicy: a spec that no longer compiles (an older record's)
// applies nothing; Reset forgets the records, not the policy.
func TestSetPolicy(t *testing.T) {
	var s State
	s.SetPolicy(&api.AuditSpec{Policy: []api.AuditRule{{On: "bogus:x", Do: api.AuditDoFlag}}})
	if p := s.policy.Load(); p == nil || !p.Empty() || p.Off() {
		t.Fatalf("a spec that does not compile: %+v", p)
	}
	s.SetPolicy(&api.AuditSpec{Off: true})
	s.ring.Add(api.AuditRecord{})
	s.Reset()
	if recs, _ := s.ring.List(&edgeproto.AuditRequest{}); len(recs) != 0 || !s.policy.Load().Off() {
		t.Fatalf("after reset: %d records, off %v", len(recs), s.policy.Load().Off())
	}
}
