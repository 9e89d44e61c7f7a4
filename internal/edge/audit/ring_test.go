package audit

import (
	"reflect"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// TestRingDropsOldest: a full ring drops its oldest records, counts
// them, and lists the rest oldest first; filters select by step and kind.
func TestRingDropsOldest(t *testing.T) {
	var a Ring
	n := RingSize + 10
	for i := range n {
		kind := api.AuditKindExec
		if i%2 == 1 {
			kind = api.AuditKindSignal
		}
		a.Add(api.AuditRecord{Pid: i, Step: int64(i % 3), Kind: kind})
	}
	recs, dropped := a.List(&edgeproto.AuditRequest{})
	if dropped != 10 || len(recs) != RingSize {
		t.Fatalf("dropped %d, kept %d; want 10, %d", dropped, len(recs), RingSize)
	}
	for i, r := range recs {
		if r.Pid != i+10 || r.Seq != int64(i+11) {
			t.Fatalf("record %d is pid %d seq %d, want %d, %d (oldest first, oldest dropped)", i, r.Pid, r.Seq, i+10, i+11)
		}
	}
	recs, _ = a.List(&edgeproto.AuditRequest{Step: 2, HasStep: true, Kind: api.AuditKindSignal})
	for _, r := range recs {
		if r.Step != 2 || r.Kind != api.AuditKindSignal {
			t.Fatalf("filter step 2, signal: %+v", r)
		}
	}
	if len(recs) == 0 {
		t.Fatal("filter step 2, signal: nothing")
	}
	a.Reset()
	if recs, dropped := a.List(&edgeproto.AuditRequest{}); len(recs) != 0 || dropped != 0 {
		t.Fatalf("after reset: %d records, %d dropped", len(recs), dropped)
	}
	a.Add(api.AuditRecord{})
	if recs, _ := a.List(&edgeproto.AuditRequest{}); len(recs) != 1 || recs[0].Seq != 1 {
		t.Fatalf("after reset, numbering starts again: %+v", recs)
	}
}

func seqs(recs []api.AuditRecord) []int64 {
	out := []int64{}
	for _, r := range recs {
		out = append(out, r.Seq)
	}
	return out
}

// TestRingListFilters: after, step (step 0 only when asked for) and kind
// select, each alone and together.
func TestRingListFilters(t *testing.T) {
	var a Ring
	steps := []int64{0, 1, 1, 2, 0, 1, 2, 0}
	kinds := []string{"exec", "file", "exec", "exec", "signal", "exec", "file", "exec"}
	for i := range steps {
		a.Add(api.AuditRecord{Step: steps[i], Kind: kinds[i]})
	}
	for _, c := range []struct {
		name string
		req  edgeproto.AuditRequest
		want []int64
	}{
		{"all", edgeproto.AuditRequest{}, []int64{1, 2, 3, 4, 5, 6, 7, 8}},
		{"step 0 without has_step is every step", edgeproto.AuditRequest{Step: 0}, []int64{1, 2, 3, 4, 5, 6, 7, 8}},
		{"after 5", edgeproto.AuditRequest{After: 5}, []int64{6, 7, 8}},
		{"after the newest", edgeproto.AuditRequest{After: 8}, []int64{}},
		{"step 0", edgeproto.AuditRequest{HasStep: true}, []int64{1, 5, 8}},
		{"step 1", edgeproto.AuditRequest{Step: 1, HasStep: true}, []int64{2, 3, 6}},
		{"exec", edgeproto.AuditRequest{Kind: "exec"}, []int64{1, 3, 4, 6, 8}},
		{"step 1 exec after 2", edgeproto.AuditRequest{Step: 1, HasStep: true, Kind: "exec", After: 2}, []int64{3, 6}},
		{"no such kind", edgeproto.AuditRequest{Kind: "connect"}, []int64{}},
	} {
		got, dropped := a.List(&c.req)
		if !reflect.DeepEqual(seqs(got), c.want) || dropped != 0 {
			t.Errorf("%s: seqs %v dropped %d, want %v, 0", c.name, seqs(got), dropped, c.want)
		}
	}
}

// TestRingUnsaved: a step's records and those between steps, after a
// seq, at most limit (the rest counted), and the newest seq looked at
// (records of other steps included).
func TestRingUnsaved(t *testing.T) {
	var a Ring
	for _, s := range []int64{0, 1, 1, 2, 0, 1, 2} {
		a.Add(api.AuditRecord{Step: s})
	}
	got, last, over := a.Unsaved(0, 1, 10)
	if want := []int64{1, 2, 3, 5, 6}; !reflect.DeepEqual(seqs(got), want) || last != 7 || over != 0 {
		t.Fatalf("step 1: seqs %v last %d over %d; want %v, 7, 0", seqs(got), last, over, want)
	}
	got, last, over = a.Unsaved(0, 1, 2)
	if want := []int64{1, 2}; !reflect.DeepEqual(seqs(got), want) || last != 7 || over != 3 {
		t.Fatalf("step 1, limit 2: seqs %v last %d over %d; want %v, 7, 3", seqs(got), last, over, want)
	}
	got, last, over = a.Unsaved(4, 2, 10)
	if want := []int64{5, 7}; !reflect.DeepEqual(seqs(got), want) || last != 7 || over != 0 {
		t.Fatalf("step 2 after 4: seqs %v last %d over %d; want %v, 7, 0", seqs(got), last, over, want)
	}
	got, last, over = a.Unsaved(7, 1, 10)
	if len(got) != 0 || last != 7 || over != 0 {
		t.Fatalf("nothing new: %v last %d over %d", seqs(got), last, over)
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
