package edge

import (
	"reflect"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// TestAuditRingDropsOldest: a full ring drops its oldest records, counts
// them, and lists the rest oldest first; filters select by step and kind.
func TestAuditRingDropsOldest(t *testing.T) {
	var a auditRing
	n := AuditRingSize + 10
	for i := range n {
		kind := api.AuditKindExec
		if i%2 == 1 {
			kind = api.AuditKindSignal
		}
		a.add(api.AuditRecord{Pid: i, Step: int64(i % 3), Kind: kind})
	}
	recs, dropped := a.list(&AuditRequest{})
	if dropped != 10 || len(recs) != AuditRingSize {
		t.Fatalf("dropped %d, kept %d; want 10, %d", dropped, len(recs), AuditRingSize)
	}
	for i, r := range recs {
		if r.Pid != i+10 {
			t.Fatalf("record %d is pid %d, want %d (oldest first, oldest dropped)", i, r.Pid, i+10)
		}
	}
	recs, _ = a.list(&AuditRequest{Step: 2, HasStep: true, Kind: api.AuditKindSignal})
	for _, r := range recs {
		if r.Step != 2 || r.Kind != api.AuditKindSignal {
			t.Fatalf("filter step 2, signal: %+v", r)
		}
	}
	if len(recs) == 0 {
		t.Fatal("filter step 2, signal: nothing")
	}
	a.reset()
	if recs, dropped := a.list(&AuditRequest{}); len(recs) != 0 || dropped != 0 {
		t.Fatalf("after reset: %d records, %d dropped", len(recs), dropped)
	}
}

// TestAuditSummary: counts per step and kind, steps in order.
func TestAuditSummary(t *testing.T) {
	recs := []api.AuditRecord{{Step: 2, Kind: "exec"}, {Step: 0, Kind: "exec"}, {Step: 2, Kind: "exec"}, {Step: 2, Kind: "file"}, {Step: 1, Kind: "signal"}}
	got := edgeproto.SummarizeAudit(recs)
	want := []api.AuditStepSummary{{Step: 0, Counts: map[string]int64{"exec": 1}}, {Step: 1, Counts: map[string]int64{"signal": 1}}, {Step: 2, Counts: map[string]int64{"exec": 2, "file": 1}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("summary %+v, want %+v", got, want)
	}
}
