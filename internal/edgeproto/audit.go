package edgeproto

import (
	"cmp"
	"slices"

	"github.com/warrenhq/warren/api"
)

// AuditEntry is one entry of a trajectory's persisted audit: the records
// of one step and those between steps before it ended.
type AuditEntry struct {
	Step    int64             `json:"step"`
	Records []api.AuditRecord `json:"records"`
	// Dropped counts records of the step beyond MaxSavedAudit.
	Dropped int64 `json:"dropped,omitempty"`
}

// MaxSavedAudit bounds the records persisted per step.
const MaxSavedAudit = 1024

// SummarizeAudit counts records per step (in step order) and kind, and
// those a policy rule matched.
func SummarizeAudit(recs []api.AuditRecord) []api.AuditStepSummary {
	at := map[int64]int{}
	out := []api.AuditStepSummary{}
	for _, r := range recs {
		i, ok := at[r.Step]
		if !ok {
			i = len(out)
			at[r.Step] = i
			out = append(out, api.AuditStepSummary{Step: r.Step, Counts: map[string]int64{}})
		}
		out[i].Counts[r.Kind]++
		if r.Rule != "" {
			out[i].Matched++
		}
	}
	slices.SortFunc(out, func(a, b api.AuditStepSummary) int { return cmp.Compare(a.Step, b.Step) })
	return out
}
