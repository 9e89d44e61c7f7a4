package edge

// Lock order: sandbox.snap or sandbox.pmu, then Edge.mu, then sandbox.mu
// (the whole order is in edge.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/audit"
	"github.com/warrenhq/warren/internal/edge/elastic"
	"github.com/warrenhq/warren/internal/edge/history"
	"github.com/warrenhq/warren/internal/edge/snapshot"
	"github.com/warrenhq/warren/internal/edge/trajectory"
	"github.com/warrenhq/warren/internal/runtime"
)

// record is what the edge persists per sandbox (DataDir/edge/sandboxes/<id>.json).
type record struct {
	Sandbox api.Sandbox              `json:"sandbox"`
	Spec    api.CreateSandboxRequest `json:"spec"`
	Handle  *runtime.Handle          `json:"handle,omitempty"`
	// Layers are the diff ids the sandbox holds mounted, top-most first.
	Layers []string `json:"layers,omitempty"`
	// Upper is the overlay's writable directory (packed by layer_create).
	Upper string `json:"upper,omitempty"`
	// Binds are the layers attached at mount points; their diff ids are the
	// last len(Binds) entries of Layers.
	Binds []agentproto.Bind `json:"binds,omitempty"`
	// Storage names the sandbox's cgroup, state dir and writable layer when
	// it differs from its id: a sandbox claimed from a warm pool keeps the
	// name it was created under. Empty = Sandbox.ID.
	Storage string `json:"storage,omitempty"`
	// Layer names the sandbox's writable layer (and the holder of its
	// mounted layers) when it differs from Storage: a sandbox in a
	// recycled container has a new writable layer in an old container.
	// Empty = storage().
	Layer string `json:"layer,omitempty"`
	// CPUBase is the CPU time (seconds) its container had used before it
	// (a recycled container); stats subtract it.
	CPUBase float64 `json:"cpu_base,omitempty"`
}

// storage is the name the sandbox's host resources live under.
func (r *record) storage() string {
	if r.Storage != "" {
		return r.Storage
	}
	return r.Sandbox.ID
}

// layer is the name of the sandbox's writable layer.
func (r *record) layer() string {
	if r.Layer != "" {
		return r.Layer
	}
	return r.storage()
}

// sandbox is the edge's live state of one sandbox.
type sandbox struct {
	pmu        sync.Mutex // serializes pause and resume
	wmu        sync.Mutex // serializes persistSandbox's writes of rec
	mu         sync.Mutex
	snap       snapshot.State // one snapshot at a time, and its last one (internal/edge/snapshot)
	rec        record
	inst       *runtime.Instance
	lastActive time.Time
	inflight   int
	stopping   bool
	pausing    bool // the reaper is pausing it (idle timeout)
	detached   bool
	stoppedAt  time.Time
	ready      chan struct{} // closed once creation finished (either way)
	createErr  error
	pool       string           // the warm pool holding it, until claimed ("" = a user's sandbox)
	stopWatch  chan struct{}    // closed to end watch (its container was recycled)
	stateless  bool             // an FnCall worker
	reclaimed  bool             // an idle FnCall worker stopped for room: admission no longer counts it
	traj       *trajectory.Traj // nil unless the sandbox records a trajectory
	hist       history.Commands // recent commands (its own lock)
	cpu        elastic.CPU      // its CPU gate: full CPU only while operations run (internal/edge/elastic, elastic.go)
	// audit is what its processes did, its audit policy, the operations
	// a policy hook ends and the times its trusted commands ran
	// (internal/edge/audit, audit.go; its own locks).
	audit audit.State

	// killsRead says oomSeen and pidsSeen hold the sandbox's kill counters
	// as of its last command (kills.go).
	killsRead         bool
	oomSeen, pidsSeen int64
}

func (sb *sandbox) view() api.Sandbox {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	v := sb.rec.Sandbox
	v.LastActive = sb.lastActive
	v.IdleCPU, v.AlwaysOn = elastic.IdleCPU(&sb.rec.Spec), sb.rec.Spec.AlwaysOn
	v.Labels = copyMap(v.Labels)
	v.Network = sb.rec.Spec.Network
	return v
}

func (sb *sandbox) pooled() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.pool != ""
}

func (sb *sandbox) live() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	s := sb.rec.Sandbox.State
	return s == api.StateRunning || s == api.StateCreating || s == api.StatePaused
}

func (sb *sandbox) detach() {
	sb.mu.Lock()
	sb.detached = true
	inst := sb.inst
	sb.mu.Unlock()
	if inst != nil {
		_ = inst.Agent.Close()
	}
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (e *Edge) recordPath(id string) string { return filepath.Join(e.recordsDir(), id+".json") }

// persist writes the record so that a kill of the warren process at any
// moment leaves either the old or the new one. It does not fsync: the
// record must survive a crash of the warren process (the page cache keeps
// it), and a crash of the whole machine ends every sandbox too, after which
// reconcile frees whatever storage has no record.
//
// A record of up to a page is rewritten in place (see writeRecordInPlace):
// replacing the file instead (temp file, rename) makes and frees an inode
// every time, which on a busy node costs more than everything else the
// write does (on ext4 without a journal, inode allocation scans for
// recently deleted inodes).
func (e *Edge) persist(rec *record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := e.recordPath(rec.Sandbox.ID)
	if len(b) <= recordPage {
		done, err := writeRecordInPlace(p, b, 0)
		if errors.Is(err, os.ErrNotExist) {
			// A new record: in a spare file when there is one.
			e.takeSpareRecord(p)
			done, err = writeRecordInPlace(p, b, os.O_CREATE)
		}
		if err != nil {
			return fmt.Errorf("edge: persist %s: %w", rec.Sandbox.ID, err)
		}
		if done {
			return nil
		}
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("edge: persist %s: %w", rec.Sandbox.ID, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("edge: persist %s: %w", rec.Sandbox.ID, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("edge: persist %s: %w", rec.Sandbox.ID, err)
	}
	return nil
}

// persistSandbox writes sb's record as it is now. Writes through it are
// ordered: the record copied last is the one written last, so a writer
// holding an older copy (the reaper's last-activity flush) can never
// overwrite a newer state (a pause's intent). A stopping sandbox's record
// is not written: stop drops it (after the write in flight, see stop).
func (e *Edge) persistSandbox(sb *sandbox) error {
	sb.wmu.Lock()
	defer sb.wmu.Unlock()
	sb.mu.Lock()
	if sb.stopping {
		sb.mu.Unlock()
		return nil
	}
	rec := sb.rec
	sb.mu.Unlock()
	return e.persist(&rec)
}

// recordPage bounds the records written in place: one write(2) of at most
// a page at offset 0 copies a single page, so a signal cannot cut it short.
const recordPage = 4096

// maxSpareRecords bounds the record files kept for reuse.
const maxSpareRecords = 256

// dropRecord removes sandbox id's record. The file is kept under a spare
// name for the next new record when there is room: on ext4 without a
// journal, making an inode scans the inode table for recently deleted
// ones (recently_deleted), and with hundreds of sandboxes a second made
// and deleted that scan cost more than anything else warren does for a
// sandbox (5 % of the host's CPU in create→exec→stop). A spare's content
// is an old record whose id does not match its name once reused, which
// loadRecords drops should a crash come before the new record is written.
func (e *Edge) dropRecord(id string) {
	p := e.recordPath(id)
	e.spareMu.Lock()
	defer e.spareMu.Unlock()
	if len(e.spareRecords) < maxSpareRecords {
		e.spareSeq++
		spare := filepath.Join(e.recordsDir(), ".spare-"+strconv.Itoa(e.spareSeq))
		if os.Rename(p, spare) == nil {
			e.spareRecords = append(e.spareRecords, spare)
			return
		}
	}
	_ = os.Remove(p)
}

// takeSpareRecord renames a spare record file to p, when there is one.
func (e *Edge) takeSpareRecord(p string) {
	e.spareMu.Lock()
	defer e.spareMu.Unlock()
	for len(e.spareRecords) > 0 {
		spare := e.spareRecords[len(e.spareRecords)-1]
		e.spareRecords = e.spareRecords[:len(e.spareRecords)-1]
		if os.Rename(spare, p) == nil {
			return
		}
	}
}

// writeRecordInPlace writes b over the file at p (creating it) in one write
// at offset 0, padded with spaces (which JSON ignores) to the old length so
// no byte of the old record survives. done is false when the file holds
// more than a page: the caller must replace it.
func writeRecordInPlace(p string, b []byte, flag int) (done bool, err error) {
	f, err := os.OpenFile(p, os.O_WRONLY|flag, 0o600)
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	if st.Size() > recordPage {
		return false, nil
	}
	if pad := int(st.Size()) - len(b); pad > 0 {
		b = append(b, bytes.Repeat([]byte{' '}, pad)...)
	}
	n, err := f.WriteAt(b, 0)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	return err == nil, err
}

func (e *Edge) loadRecords() ([]record, error) {
	ents, err := os.ReadDir(e.recordsDir())
	if err != nil {
		return nil, fmt.Errorf("edge: read records: %w", err)
	}
	var out []record
	for _, ent := range ents {
		name := ent.Name()
		p := filepath.Join(e.recordsDir(), name)
		if filepath.Ext(name) != ".json" {
			_ = os.Remove(p) // a temp file of an interrupted write
			continue
		}
		b, err := os.ReadFile(p)
		var rec record
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || NodeOf(rec.Sandbox.ID) != e.cfg.Node || rec.Sandbox.ID+".json" != name {
			e.log.Warn("dropping unreadable sandbox record", "file", name, "err", err)
			_ = os.Remove(p)
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// reconcile adopts sandboxes that survived a restart and frees everything
// else this node left behind: runtime leftovers, writable dirs, state dirs.
func (e *Edge) reconcile(ctx context.Context) error {
	recs, err := e.loadRecords()
	if err != nil {
		return err
	}
	adopted := map[string]bool{} // by storage name
	var refreezes sync.WaitGroup // adopted paused sandboxes being frozen again
	defer waitRefreezes(&refreezes)
	holders := map[string][]string{} // storage name -> the layers it holds mounted
	for i := range recs {
		rec := recs[i]
		id := rec.Sandbox.ID
		store := rec.storage()
		if _, lost := e.lost[id]; lost {
			e.put(id, e.reconcileLost(ctx, rec))
			continue
		}
		if rec.Handle != nil && (rec.Sandbox.State == api.StateRunning || rec.Sandbox.State == api.StatePaused) {
			// Bounded: a sandbox whose agent does not answer at once is
			// retried in the background (adopt.go), never waited on here.
			if e.adopt(ctx, rec, &refreezes) {
				adopted[store] = true
				adopted[rec.layer()] = true
				holders[rec.layer()] = rec.Layers
				continue
			}
		}
		h := runtime.Handle{ID: store, Socket: filepath.Join(e.stateDir(store), "agent.sock")}
		if rec.Handle != nil {
			h = *rec.Handle
		}
		if err := e.cfg.Runtime.Destroy(ctx, h); err != nil {
			e.log.Error("destroy leftover sandbox", "id", id, "err", err)
		}
		e.freeStorage(store, rec.layer())
		e.dropRecord(id)
		rec.Sandbox.State = api.StateFailed
		rec.Sandbox.Reason = "lost while the edge was down"
		sb := &sandbox{rec: rec, stoppedAt: time.Now(), ready: make(chan struct{})}
		close(sb.ready)
		e.put(id, sb)
	}
	left, err := e.cfg.Runtime.Leftovers(ctx)
	if err != nil {
		return fmt.Errorf("edge: list leftovers: %w", err)
	}
	for _, h := range left {
		if !adopted[h.ID] {
			e.log.Info("removing leftover sandbox", "id", h.ID)
			if err := e.cfg.Runtime.Destroy(ctx, h); err != nil {
				e.log.Error("destroy leftover", "id", h.ID, "err", err)
			}
		}
	}
	ids, err := e.cfg.Writable.List()
	if err != nil {
		return fmt.Errorf("edge: list writable layers: %w", err)
	}
	for _, id := range ids {
		if !adopted[id] {
			_ = e.cfg.Writable.Free(id)
		}
	}
	ents, _ := os.ReadDir(e.runDir())
	for _, ent := range ents {
		if !adopted[ent.Name()] {
			_ = os.RemoveAll(filepath.Join(e.runDir(), ent.Name()))
		}
	}
	if err := e.cfg.Images.ReconcileMounts(holders); err != nil {
		e.log.Error("reconcile layer mounts", "err", err)
	}
	return nil
}

// freeStorage frees a sandbox's host resources but its runtime's: the
// state dir of its container (store), its writable layer and the layers
// it holds mounted (layer).
func (e *Edge) freeStorage(store, layer string) {
	e.freeLayer(layer)
	_ = os.RemoveAll(e.stateDir(store))
}

// allocWritable makes the writable layer name with a disk limit of diskMB,
// and its overlay upper and work directories.
func (e *Edge) allocWritable(name string, diskMB int64) (upper, work string, err error) {
	wdir, err := e.cfg.Writable.Alloc(name, diskMB<<20)
	if err != nil {
		return "", "", fmt.Errorf("writable layer: %w", err)
	}
	upper, work = filepath.Join(wdir, "upper"), filepath.Join(wdir, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", fmt.Errorf("prepare %s: %w", d, err)
		}
	}
	return upper, work, nil
}

// freeLayer frees a writable layer and the mounted layers its name holds
// ("": none).
func (e *Edge) freeLayer(layer string) {
	if layer == "" {
		return
	}
	if err := e.cfg.Writable.Free(layer); err != nil {
		e.log.Warn("free writable layer", "id", layer, "err", err)
	}
	e.cfg.Images.ReleaseLayers(layer)
}

// watch marks the sandbox failed when its agent channel closes unexpectedly.
func (e *Edge) watch(sb *sandbox) {
	inst := sb.inst
	stop := make(chan struct{})
	sb.mu.Lock()
	sb.stopWatch = stop
	sb.mu.Unlock()
	e.watches.Add(1)
	go func() {
		defer e.watches.Done()
		select {
		case <-inst.Agent.Done():
		case <-stop:
			return
		}
		sb.mu.Lock()
		expected := sb.stopping || sb.detached
		sb.mu.Unlock()
		if !expected {
			e.log.Warn("agent channel closed; sandbox failed", "id", sb.rec.Sandbox.ID, "err", inst.Agent.Err())
			e.stop(context.Background(), sb, api.StateFailed, "sandbox agent exited")
		}
	}()
}

// unwatch ends watch: the agent channel now serves another sandbox.
func (sb *sandbox) unwatch() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.stopWatch != nil {
		close(sb.stopWatch)
		sb.stopWatch = nil
	}
}

// stop ends a sandbox and frees everything it holds; it keeps a tombstone so
// that GET still answers for a while. Safe to call more than once.
func (e *Edge) stop(ctx context.Context, sb *sandbox, state, reason string) {
	sb.mu.Lock()
	if sb.stopping {
		sb.mu.Unlock()
		return
	}
	sb.stopping = true
	sb.cpu.CloseLocked()
	inst := sb.inst
	id := sb.rec.Sandbox.ID
	store := sb.rec.storage()
	pooled := sb.pool != ""
	layer := sb.rec.layer()
	h := runtime.Handle{ID: store, Socket: filepath.Join(e.stateDir(store), "agent.sock")}
	if sb.rec.Handle != nil {
		h = *sb.rec.Handle
	}
	recycle := e.recyclableLocked(sb, state)
	sb.mu.Unlock()
	// A record write in flight (persistSandbox) ends before the record is
	// dropped below; later ones see stopping.
	sb.wmu.Lock()
	sb.wmu.Unlock()
	e.auditStop(sb)

	if recycle && e.keepContainer(ctx, sb, inst) {
		// The container waits for another sandbox (recycle.go), with this
		// one's root until then.
		if !pooled {
			e.dropRecord(id)
		}
		sb.mu.Lock()
		// The agent and the container serve another sandbox from now on:
		// nothing may reach them through this one.
		sb.inst, sb.rec.Handle = nil, nil
		sb.rec.Sandbox.State = state
		sb.rec.Sandbox.Reason = reason
		sb.stoppedAt = time.Now()
		sb.mu.Unlock()
		e.log.Info("sandbox stopped", "id", id, "state", state, "reason", reason, "container", "kept")
		return
	}
	if inst != nil {
		_ = inst.Agent.Close()
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := e.cfg.Runtime.Destroy(dctx, h); err != nil {
		// Keep the record: the next reconcile retries.
		e.log.Error("destroy sandbox", "id", id, "err", err)
	} else {
		t1 := time.Now()
		e.freeStorage(store, layer)
		if !pooled {
			e.dropRecord(id)
		}
		e.log.Debug("sandbox destroyed", "id", id, "runtime", t1.Sub(t0), "storage", time.Since(t1))
	}
	sb.mu.Lock()
	sb.rec.Sandbox.State = state
	sb.rec.Sandbox.Reason = reason
	sb.stoppedAt = time.Now()
	sb.mu.Unlock()
	e.log.Info("sandbox stopped", "id", id, "state", state, "reason", reason)
}

var errStopped = errors.New("stopped")
