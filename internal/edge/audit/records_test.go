package audit

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/telemetry"
)

type fakeSandbox struct {
	id, project string
	live        bool
	st          State
}

func (f *fakeSandbox) ID() string                 { return f.id }
func (f *fakeSandbox) Project() string            { return f.project }
func (f *fakeSandbox) Audit() *State              { return &f.st }
func (f *fakeSandbox) Watched() (bool, string)    { return true, "" }
func (f *fakeSandbox) Live() bool                 { return f.live }
func (f *fakeSandbox) records() []api.AuditRecord { return list(f, &edgeproto.AuditRequest{}) }

func list(f *fakeSandbox, req *edgeproto.AuditRequest) []api.AuditRecord {
	recs, _ := f.st.ring.List(req)
	return recs
}

type charge struct {
	project, key string
	n            int64
}

type fakeHost struct {
	mu        sync.Mutex
	after     []func()
	delays    []time.Duration
	appendErr error
	appended  map[string][][]byte
	charged   []charge
	failed    []string
}

func (h *fakeHost) Logger() *slog.Logger { return slog.New(slog.DiscardHandler) }
func (h *fakeHost) After(d time.Duration, f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.after, h.delays = append(h.after, f), append(h.delays, d)
}
func (h *fakeHost) AppendAudit(_ context.Context, key string, b []byte) error {
	if h.appendErr != nil {
		return h.appendErr
	}
	if h.appended == nil {
		h.appended = map[string][][]byte{}
	}
	h.appended[key] = append(h.appended[key], b)
	return nil
}
func (h *fakeHost) Charge(_ context.Context, project, key string, n int64) {
	h.charged = append(h.charged, charge{project, key, n})
}
func (h *fakeHost) Fail(sb Sandbox, reason string) { h.failed = append(h.failed, sb.ID()+": "+reason) }

// runAfter runs what After was given, in order, and forgets it.
func (h *fakeHost) runAfter() int {
	h.mu.Lock()
	fs := h.after
	h.after = nil
	h.mu.Unlock()
	for _, f := range fs {
		f()
	}
	return len(fs)
}

func newNode() (*Node, *fakeHost) {
	h := &fakeHost{}
	return New(h, nil), h
}

// policy sets sb's audit options, which must compile.
func policy(t *testing.T, sb *fakeSandbox, spec *api.AuditSpec) {
	t.Helper()
	sb.st.SetPolicy(spec)
	if sb.st.policy.Load().Empty() {
		t.Fatalf("policy %+v did not compile", spec)
	}
}

// TestAddPolicy: the create's options filter the records and their hooks
// flag, kill the step's operations or fail the sandbox.
func TestAddPolicy(t *testing.T) {
	n, h := newNode()
	exec := func(p string) api.AuditRecord { return api.AuditRecord{Kind: api.AuditKindExec, Path: p} }

	none := &fakeSandbox{id: "none"} // no SetPolicy yet: everything kept
	n.Add(none, exec("/bin/ls"))
	if got := none.records(); len(got) != 1 || got[0].Rule != "" {
		t.Fatalf("no policy: %+v", got)
	}

	off := &fakeSandbox{id: "off"}
	policy(t, off, &api.AuditSpec{Off: true})
	n.Add(off, exec("/bin/ls"))
	if got := off.records(); len(got) != 0 {
		t.Fatalf("audit off: %+v", got)
	}

	ws := &fakeSandbox{id: "ws"}
	policy(t, ws, &api.AuditSpec{Workspace: []string{"/work"}})
	n.Add(ws, api.AuditRecord{Kind: api.AuditKindFile, Op: "write", Path: "/work/a"})
	n.Add(ws, api.AuditRecord{Kind: api.AuditKindFile, Op: "write", Path: "/etc/passwd"})
	if got := ws.records(); len(got) != 1 || got[0].Path != "/etc/passwd" {
		t.Fatalf("workspace /work: %+v", got)
	}

	sb := &fakeSandbox{id: "sb-1"}
	policy(t, sb, &api.AuditSpec{Policy: []api.AuditRule{
		{On: "exec:/usr/bin/*", Do: api.AuditDoFlag},
		{On: "exec:/bin/rm", Do: api.AuditDoKillStep},
		{On: "connect", Do: api.AuditDoFailSandbox},
	}})
	op, leave := sb.st.Enter(context.Background())
	defer leave()
	n.Add(sb, exec("/usr/bin/curl"))
	n.Add(sb, exec("/bin/true"))
	if KilledByPolicy(op) {
		t.Fatal("a flag killed the step")
	}
	n.Add(sb, exec("/bin/rm"))
	if !KilledByPolicy(op) {
		t.Fatal("kill-step did not cancel the running operation")
	}
	if len(h.failed) != 0 {
		t.Fatalf("kill-step failed the sandbox: %v", h.failed)
	}
	op2, leave2 := sb.st.Enter(context.Background())
	defer leave2()
	n.Add(sb, api.AuditRecord{Kind: api.AuditKindConnect, Dest: "10.0.0.1:80"})
	if !KilledByPolicy(op2) || !reflect.DeepEqual(h.failed, []string{"sb-1: audit policy: connect"}) {
		t.Fatalf("fail-sandbox: killed %v, failed %v", KilledByPolicy(op2), h.failed)
	}
	var got [][2]string
	for _, r := range sb.records() {
		got = append(got, [2]string{r.Rule, r.Action})
	}
	want := [][2]string{{"exec:/usr/bin/*", "flag"}, {"", ""}, {"exec:/bin/rm", "kill-step"}, {"connect", "fail-sandbox"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rules and actions %v, want %v", got, want)
	}
}

// TestLimitsAndDenied: the core's own records carry the step running now
// (Step) and say what was hit or refused.
func TestLimitsAndDenied(t *testing.T) {
	n, _ := newNode()
	sb := &fakeSandbox{id: "sb-1"}
	n.Step(&sb.st, 7)
	n.Limits(sb, &api.ExecResult{OOMKilled: true, Truncated: true})
	n.Step(&sb.st, 0)
	n.Limits(sb, &api.ExecResult{PidsLimited: true, DiskFull: true})
	n.Limits(sb, &api.ExecResult{}) // nothing hit
	n.Limit(sb, api.AuditLimitPids)
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	n.Step(&sb.st, 3)
	n.Denied(sb, api.NetworkDenialRecord{Time: at, Step: 9, Destination: "10.1.2.3:443", Protocol: "tcp", Reason: "policy", Count: 4})
	recs := sb.records()
	type lim struct {
		step int64
		kind string
		op   string
	}
	var got []lim
	for _, r := range recs {
		got = append(got, lim{r.Step, r.Kind, r.Op})
	}
	want := []lim{
		{7, api.AuditKindLimit, api.AuditLimitOOM}, {7, api.AuditKindLimit, api.AuditLimitOutput},
		{0, api.AuditKindLimit, api.AuditLimitPids}, {0, api.AuditKindLimit, api.AuditLimitDisk},
		{0, api.AuditKindLimit, api.AuditLimitPids},
		{3, api.AuditKindDenied, "tcp"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("records %+v, want %+v", got, want)
	}
	d := recs[len(recs)-1]
	if !d.Time.Equal(at) || d.Dest != "10.1.2.3:443" || d.Reason != "policy" || d.Count != 4 {
		t.Fatalf("denied record %+v", d)
	}
	if recs[0].Time.IsZero() {
		t.Fatal("limit record without a time")
	}
}

// TestList: a kind that is no kind is a 400 naming it (cut at 32 bytes);
// the answer says whether the sandbox is live and the node has telemetry;
// a summary replaces the records.
func TestList(t *testing.T) {
	n, _ := newNode()
	sb := &fakeSandbox{id: "sb-1", live: true}
	_, err := n.List(sb, &edgeproto.AuditRequest{Kind: strings.Repeat("x", 40)})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeInvalid || !strings.Contains(ae.Message, `"`+strings.Repeat("x", 32)+`…"`) {
		t.Fatalf("bad kind: %v", err)
	}
	for _, k := range []string{api.AuditKindExec, api.AuditKindExec, api.AuditKindLimit} {
		n.Add(sb, api.AuditRecord{Kind: k, Step: 1})
	}
	out, err := n.List(sb, &edgeproto.AuditRequest{Kind: api.AuditKindExec})
	if err != nil || len(out.Records) != 2 || !out.Live || out.Telemetry || out.Summary != nil {
		t.Fatalf("list exec: %+v %v", out, err)
	}
	sb.live = false
	out, err = n.List(sb, &edgeproto.AuditRequest{Summary: true})
	want := []api.AuditStepSummary{{Step: 1, Counts: map[string]int64{"exec": 2, "limit": 1}}}
	if err != nil || len(out.Records) != 0 || out.Records == nil || out.Live || !reflect.DeepEqual(out.Summary, want) {
		t.Fatalf("summary: %+v %v", out, err)
	}
}

func entries(t *testing.T, h *fakeHost, key string) []edgeproto.AuditEntry {
	t.Helper()
	var out []edgeproto.AuditEntry
	for _, b := range h.appended[key] {
		var e edgeproto.AuditEntry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestSave: a step's records (and those between steps) are saved with
// the trajectory a moment later, each once, at most MaxSavedAudit an
// entry, and charged to the sandbox's project; nothing is saved where
// nothing but limits could be recorded.
func TestSave(t *testing.T) {
	n, h := newNode()
	plain := &fakeSandbox{id: "plain", project: "p"}
	n.Add(plain, api.AuditRecord{Kind: api.AuditKindLimit, Step: 1})
	n.Save(plain, "k", 1)
	if h.runAfter() != 0 {
		t.Fatal("no telemetry, no policy: a save was scheduled")
	}

	sb := &fakeSandbox{id: "sb-1", project: "p"}
	policy(t, sb, &api.AuditSpec{Policy: []api.AuditRule{{On: "exec:/x", Do: api.AuditDoFlag}}})
	for _, s := range []int64{0, 1, 2, 1} {
		n.Add(sb, api.AuditRecord{Kind: api.AuditKindLimit, Step: s})
	}
	n.Save(sb, "k", 1)
	if len(h.delays) != 1 || h.delays[0] != saveDelay {
		t.Fatalf("delays %v, want one of %v", h.delays, saveDelay)
	}
	if len(h.appended["k"]) != 0 {
		t.Fatal("saved before the delay")
	}
	h.runAfter()
	got := entries(t, h, "k")
	if len(got) != 1 || got[0].Step != 1 || !reflect.DeepEqual(seqs(got[0].Records), []int64{1, 2, 4}) || got[0].Dropped != 0 {
		t.Fatalf("entries %+v", got)
	}
	if !reflect.DeepEqual(h.charged, []charge{{"p", "k", int64(len(h.appended["k"][0]))}}) {
		t.Fatalf("charged %+v", h.charged)
	}
	n.Save(sb, "k", 1) // nothing new
	h.runAfter()
	if len(h.appended["k"]) != 1 {
		t.Fatal("the same records saved twice")
	}
	for range edgeproto.MaxSavedAudit + 3 {
		n.Add(sb, api.AuditRecord{Kind: api.AuditKindLimit, Step: 3})
	}
	n.Save(sb, "k", 3)
	h.runAfter()
	got = entries(t, h, "k")
	if len(got) != 2 || len(got[1].Records) != edgeproto.MaxSavedAudit || got[1].Dropped != 3 || got[1].Records[0].Seq != 5 {
		t.Fatalf("over the bound: %d entries, last %d records, %d dropped", len(got), len(got[len(got)-1].Records), got[len(got)-1].Dropped)
	}
	h.appendErr = errors.New("down")
	n.Add(sb, api.AuditRecord{Kind: api.AuditKindLimit, Step: 4})
	n.Save(sb, "k", 4)
	h.runAfter()
	if len(h.charged) != 2 {
		t.Fatalf("a failed append was charged: %+v", h.charged)
	}
}

// TestDeliver: what the kernel recorded reaches its registered sandbox,
// its uid as the sandbox numbers it, except the session shells' plumbing,
// a trusted command's own work, and a sandbox no longer registered.
func TestDeliver(t *testing.T) {
	n, _ := newNode()
	sb := &fakeSandbox{id: "sb-1"}
	n.by = map[uint64]registered{5: {sb: sb, idBase: 100000}}
	now := time.Now()
	n.deliver(telemetry.Record{Cookie: 5, Time: now, Kind: telemetry.KindExec, Path: "/bin/ls", UID: 101000})
	n.deliver(telemetry.Record{Cookie: 5, Time: now, Kind: telemetry.KindExec, Path: "/bin/id", UID: 0})
	n.deliver(telemetry.Record{Cookie: 5, Time: now, Kind: telemetry.KindExec, Path: "/bin/ps", UID: 100000 + sandboxIDs})
	n.deliver(telemetry.Record{Cookie: 5, Time: now, Kind: telemetry.KindFile, Op: "write", Path: sessionPlumbing + "fifo"})
	n.deliver(telemetry.Record{Cookie: 6, Time: now, Kind: telemetry.KindExec, Path: "/bin/other"})
	sb.st.BeginTrusted()
	n.deliver(telemetry.Record{Cookie: 5, Time: time.Now(), Kind: telemetry.KindFile, Op: "write", Path: "/x", Beside: true})
	n.deliver(telemetry.Record{Cookie: 5, Time: time.Now(), Kind: telemetry.KindFile, Op: "write", Path: "/y"})
	sb.st.EndTrusted()
	n.deliver(telemetry.Record{Cookie: 5, Time: tick(), Kind: telemetry.KindFile, Op: "write", Path: "/z", Beside: true})
	var paths []string
	for _, r := range sb.records() {
		paths = append(paths, r.Path)
	}
	if want := []string{"/bin/ls", "/bin/id", "/bin/ps", "/y", "/z"}; !reflect.DeepEqual(paths, want) {
		t.Fatalf("delivered %v, want %v", paths, want)
	}
	recs := sb.records()
	for i, want := range [][2]int{{1000, 101000}, {0, 0}, {100000 + sandboxIDs, 100000 + sandboxIDs}} {
		if recs[i].UID != want[0] || recs[i].HostUID != want[1] {
			t.Fatalf("%s: uid %d host uid %d, want %v", recs[i].Path, recs[i].UID, recs[i].HostUID, want)
		}
	}
}
