package audit

import (
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// RingSize bounds the records kept per sandbox: beyond it the oldest are
// dropped (and counted).
const RingSize = 4096

// Ring is one sandbox's records, oldest first, at most RingSize. Its mu
// is a leaf. The zero value is ready.
type Ring struct {
	mu      sync.Mutex
	recs    []api.AuditRecord
	head    int // index of the oldest once the ring is full
	dropped int64
	seq     int64 // of the newest record
}

// Add files r as the newest record, numbered one past the last.
func (a *Ring) Add(r api.AuditRecord) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	r.Seq = a.seq
	if len(a.recs) < RingSize {
		a.recs = append(a.recs, r)
		return
	}
	a.recs[a.head] = r
	a.head = (a.head + 1) % len(a.recs)
	a.dropped++
}

// Reset forgets every record (a pool member claimed by a sandbox).
func (a *Ring) Reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs, a.head, a.dropped, a.seq = nil, 0, 0, 0
}

// List returns the records that req selects (After, Step when HasStep,
// Kind), oldest first, and how many the ring dropped.
func (a *Ring) List(req *edgeproto.AuditRequest) ([]api.AuditRecord, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.AuditRecord{}
	for i := range a.recs {
		r := a.recs[(a.head+i)%len(a.recs)]
		if r.Seq <= req.After || (req.HasStep && r.Step != req.Step) || (req.Kind != "" && r.Kind != req.Kind) {
			continue
		}
		out = append(out, r)
	}
	return out, a.dropped
}

// Unsaved returns the records after seq after that belong to step or to
// no step (between steps), at most limit (the newest dropped beyond it,
// counted), and the newest seq looked at.
func (a *Ring) Unsaved(after, step int64, limit int) ([]api.AuditRecord, int64, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []api.AuditRecord
	var over int64
	last := after
	for i := range a.recs {
		r := a.recs[(a.head+i)%len(a.recs)]
		if r.Seq <= after {
			continue
		}
		last = max(last, r.Seq)
		if r.Step != step && r.Step != 0 {
			continue
		}
		if len(out) == limit {
			over++
			continue
		}
		out = append(out, r)
	}
	return out, last, over
}
