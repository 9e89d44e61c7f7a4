package edge

// Lock order: sandbox.snapMu (held over the freeze and the copy), then
// sandbox.mu (the whole order is in edge.go).

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
	"github.com/warrenhq/warren/internal/scratch"
)

func newSnapshotID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "snap-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// snapshotOp answers OpSnapshot.
func (e *Edge) snapshotOp(ctx context.Context, req *SnapshotRequest) (*api.Snapshot, error) {
	if len(req.Name) > 128 {
		return nil, invalidf("snapshot name is longer than 128 bytes")
	}
	sb, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	snap, err := e.snapshot(ctx, sb, req.Name, 0)
	release()
	if err != nil {
		return nil, err
	}
	if req.Stop {
		e.stop(ctx, sb, api.StateStopped, "stopped after snapshot "+snap.ID)
	}
	return snap, nil
}

// snapshot freezes the sandbox, packs its writable layer into a new
// content-addressed layer, thaws it and records the chain. The caller holds
// the sandbox (acquire).
func (e *Edge) snapshot(ctx context.Context, sb *sandbox, name string, step int64) (*api.Snapshot, error) {
	sb.snapMu.Lock()
	defer sb.snapMu.Unlock()
	sb.mu.Lock()
	id := sb.rec.Sandbox.ID
	layer := sb.rec.layer()
	upper := sb.rec.Upper
	ids := append([]string(nil), sb.rec.Layers[:len(sb.rec.Layers)-len(sb.rec.Binds)]...)
	spec := sb.rec.Spec
	chain := append([]api.LayerAttachment(nil), spec.Layers...)
	h := sb.rec.Handle
	sb.mu.Unlock()
	if upper == "" || h == nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s has no writable layer to snapshot", id)}
	}
	// A snapshot's layer counts against the project's storage quota: none
	// is taken once the project is at its quota.
	if err := e.checkStorage(ctx, spec.Project, 1); err != nil {
		return nil, err
	}
	holder := id + "/snapshot"
	lowers, err := e.cfg.Images.MountLayers(holder, ids)
	if err != nil {
		return nil, err
	}
	defer e.cfg.Images.ReleaseLayers(holder)

	snapID := newSnapshotID()
	start := time.Now()
	var l *api.Layer
	var perr, cerr, terr error
	var copyDir string
	var frozen time.Duration
	t0 := start
	if isVMTier(spec.Tier) {
		// The guest packs its disk's changes (snapvm.go) into a private
		// copy beside the writable layer, as a container's is copied.
		copyDir = filepath.Join(filepath.Dir(filepath.Clean(upper)), ".snapshot-"+snapID)
		defer os.RemoveAll(copyDir)
		if frozen, cerr = e.copyVMUpper(ctx, sb, copyDir, int64(spec.DiskMB)<<20); cerr != nil {
			return nil, cerr
		}
	} else {
		cl, canClone := e.cfg.Writable.(cloner)
		if canClone && filepath.Base(filepath.Clean(upper)) == "upper" {
			// Write the sandbox's pending data out before freezing it: the
			// clone then has little to flush while it is frozen.
			if err := cl.Flush(layer); err != nil {
				e.log.Warn("flush before snapshot", "sandbox", id, "err", err)
			}
		}
		t0 = time.Now()
		if err := e.freeze(ctx, *h); err != nil {
			return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("sandbox %s could not be frozen for the snapshot: %v", id, err)}
		}
		// Frozen only while the writable layer is copied: a copy-on-write
		// snapshot of the sandbox's writable directory where its filesystem
		// can (btrfs: one ioctl), else a copy (cloning extents where it can);
		// packing the copy runs with the sandbox thawed. If the copy fails,
		// pack the live directory while frozen.
		src := filepath.Clean(upper)
		if canClone && filepath.Base(src) == "upper" {
			var dir string
			var release func() error
			if dir, release, cerr = cl.Clone(layer); cerr == nil {
				copyDir = filepath.Join(dir, "upper")
				defer func() {
					if err := release(); err != nil {
						e.log.Warn("remove the snapshot's clone", "sandbox", id, "err", err)
					}
				}()
			} else if !errors.Is(cerr, scratch.ErrNoClone) {
				e.log.Warn("snapshot clone failed; copying", "sandbox", id, "err", cerr)
			}
		}
		if copyDir == "" {
			// Beside the upper dir: the same filesystem, so the copy clones
			// extents (xfs) instead of copying data; it goes with the
			// sandbox's writable layer if warren dies before removing it.
			copyDir = filepath.Join(filepath.Dir(src), ".snapshot-"+snapID)
			if cerr = copyTree(ctx, src, copyDir); cerr == nil {
				defer os.RemoveAll(copyDir)
			}
		}
		if cerr != nil {
			_ = os.RemoveAll(copyDir)
			e.log.Warn("snapshot copy failed; packing while frozen", "sandbox", id, "err", cerr)
			l, perr = e.cfg.Images.CreateLayerFromChanges(ctx, SnapshotLayerName(snapID), 1, src, lowers, h.IDBase, "snapshot of "+id)
		}
		terr = e.cfg.Runtime.Thaw(context.WithoutCancel(ctx), *h)
		frozen = time.Since(t0)
	}
	t1 := time.Now()
	// The chain this snapshot's diff goes on: the previous snapshot of
	// the sandbox (only what changed since is packed), else its layers.
	var manifest map[string]entryMeta
	var prev *api.Snapshot
	links := 1
	if cerr == nil && terr == nil {
		manifest, prev, links, perr = e.increment(ctx, sb, id, copyDir)
		if prev != nil {
			chain = append([]api.LayerAttachment(nil), prev.Layers...)
		}
		if perr == nil {
			l, perr = e.cfg.Images.CreateLayerFromPrivateChanges(ctx, SnapshotLayerName(snapID), 1, copyDir, lowers, h.IDBase, "snapshot of "+id)
		}
	}
	if terr != nil {
		return nil, fmt.Errorf("thaw %s: %w", id, terr)
	}
	if perr != nil {
		return nil, perr
	}
	diff := fmt.Sprintf("%s@%d", l.Name, l.Version)
	snap := &api.Snapshot{
		ID: snapID, Name: name, Sandbox: id, Project: spec.Project, Image: spec.Image,
		Layers: append(chain, api.LayerAttachment{Layer: diff}), Diff: diff,
		Digest: l.Digest, Size: l.Size, Entries: l.Entries, Parent: spec.Snapshot, Step: step,
		Trajectory: func() string {
			if step > 0 {
				return spec.Trajectory
			}
			return ""
		}(),
		FrozenMs: float64(frozen.Microseconds()) / 1000, CreatedAt: time.Now().UTC(),
	}
	if prev != nil {
		snap.Previous = prev.ID
	}
	if err := e.snaps.Put(ctx, snapID, snap); err != nil {
		return nil, err
	}
	if prev != nil {
		// The previous snapshot may have been deleted while this one was
		// packed, and with it a diff nobody else needed yet: this one
		// must not name a layer that is gone.
		if err := e.chainWhole(ctx, snap); err != nil {
			sb.incr = incrState{}
			_ = e.snaps.Delete(context.WithoutCancel(ctx), snapID)
			_, _ = e.cfg.Images.DeleteLayer(context.WithoutCancel(ctx), SnapshotLayerName(snapID), 0)
			return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("snapshot of %s: %v while it was taken; take it again (it will be full)", id, err)}
		}
	}
	if manifest != nil {
		sb.incr = incrState{snap: snapID, links: links, manifest: manifest}
	} else {
		sb.incr = incrState{} // packed from the live directory: the next one is full
	}
	e.charge(ctx, spec.Project, snap.Size)
	e.log.Debug("snapshot", "sandbox", id, "snapshot", snapID, "flush", t0.Sub(start), "frozen", frozen, "pack", time.Since(t1), "bytes", l.Size)
	return snap, nil
}

// increment prepares copyDir, a private copy of sb's writable layer, to be
// packed: against the sandbox's previous snapshot when it has one that
// still exists and its chain is not long yet (only what changed since is
// left), else whole. It returns the manifest of the layer for the next
// snapshot (nil if it could not be read: the next one is full), the
// snapshot this one chains on (nil = a full one) and its link count.
// The caller holds sb.snapMu.
func (e *Edge) increment(ctx context.Context, sb *sandbox, id, copyDir string) (map[string]entryMeta, *api.Snapshot, int, error) {
	last := sb.incr
	if last.snap != "" && last.manifest != nil && last.links < maxChainLinks {
		prev, err := e.getSnapshot(ctx, last.snap)
		if err == nil && len(prev.Layers) < sandboxspec.MaxLayers {
			manifest, err := pruneUnchanged(copyDir, last.manifest)
			if err != nil {
				// The copy may be half pruned: it is neither whole nor
				// the diff.
				sb.incr = incrState{}
				return nil, nil, 0, fmt.Errorf("incremental snapshot of %s: %w", id, err)
			}
			return manifest, prev, last.links + 1, nil
		}
	}
	manifest, err := scanManifest(copyDir)
	if err != nil {
		e.log.Warn("snapshot manifest; the next snapshot is full", "sandbox", id, "err", err)
		return nil, nil, 1, nil
	}
	return manifest, nil, 1, nil
}

// chainWhole checks that every snapshot diff snap chains on still exists.
func (e *Edge) chainWhole(ctx context.Context, snap *api.Snapshot) error {
	for _, l := range snap.Layers[:len(snap.Layers)-1] {
		if !strings.HasPrefix(l.Layer, "snap/") {
			continue
		}
		if _, err := e.cfg.Images.ResolveLayer(ctx, l.Layer); err != nil {
			return fmt.Errorf("layer %s of the previous snapshot was deleted", l.Layer)
		}
	}
	return nil
}

// getSnapshot reads a snapshot record (404 when unknown).
func (e *Edge) getSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	if !sandboxspec.ValidSnapshotID(id) {
		return nil, invalidf("snapshot %q is malformed", id)
	}
	var snap api.Snapshot
	found, _, err := e.snaps.Get(ctx, id, &snap)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("snapshot %s not found", id)}
	}
	return &snap, nil
}

// fromSnapshot fills a create request's image and layers from its snapshot.
func (e *Edge) fromSnapshot(ctx context.Context, spec *api.CreateSandboxRequest) (*api.Snapshot, error) {
	if spec.Snapshot == "" {
		return nil, nil
	}
	if spec.Image != "" || len(spec.Layers) > 0 {
		return nil, invalidf("a sandbox restored from a snapshot takes its image and layers from it")
	}
	snap, err := e.getSnapshot(ctx, spec.Snapshot)
	if err != nil {
		return nil, err
	}
	if len(snap.Layers) > sandboxspec.MaxLayers {
		return nil, invalidf("snapshot %s chains %d layers (at most %d)", snap.ID, len(snap.Layers), sandboxspec.MaxLayers)
	}
	if isVMTier(spec.Tier) {
		// The create's own layers were checked for the tier; the
		// snapshot's are checked here.
		for _, l := range snap.Layers {
			if l.Mount != "" {
				return nil, invalidf("snapshot %s attaches layer %s at %s: tier %s cannot attach layers at a path yet (restore it as a container)", snap.ID, l.Layer, l.Mount, spec.Tier)
			}
		}
	}
	spec.Image = snap.Image
	spec.Layers = append([]api.LayerAttachment(nil), snap.Layers...)
	return snap, nil
}

// checkSnapshotScope refuses (404) a create on behalf of a project-scoped
// caller whose snapshot, or a snap/ layer, belongs to a project outside its
// scope, or that names a project's layer the scope does not see: the
// edge's own check behind the apiserver's (ownership).
func (e *Edge) checkSnapshotScope(ctx context.Context, spec *api.CreateSandboxRequest, scope string) error {
	if err := checkLayerScope(spec, scope); err != nil {
		return err
	}
	sids := []string{}
	if spec.Snapshot != "" {
		sids = append(sids, spec.Snapshot)
	}
	for _, a := range spec.Layers {
		name, _, _ := strings.Cut(a.Layer, "@")
		if sid, ok := strings.CutPrefix(name, "snap/"); ok {
			sids = append(sids, sid)
		}
	}
	for _, sid := range sids {
		if !sandboxspec.ValidSnapshotID(sid) {
			continue // the create refuses it
		}
		snap, err := e.getSnapshot(ctx, sid)
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
			continue // the create answers it
		}
		if err != nil {
			return err
		}
		if !sandboxspec.Within(snap.Project, scope) {
			return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("snapshot %s not found", sid)}
		}
	}
	return nil
}

// cloner is writable-layer storage that can make a copy-on-write clone of
// a sandbox's writable directory (scratch on btrfs).
type cloner interface {
	Clone(id string) (dir string, release func() error, err error)
	Flush(id string) error
}

// copyTree copies dir to dst keeping everything overlayfs needs (owners,
// modes, times, xattrs such as trusted.overlay.opaque, whiteout device
// nodes, hard links), cloning file data where the filesystem supports it.
func copyTree(ctx context.Context, dir, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", dir, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freeze stops every process of the sandbox, retrying a freeze that does
// not settle (a busy sandbox on a loaded node); a failed attempt is thawed,
// so no process stays stopped.
func (e *Edge) freeze(ctx context.Context, h runtime.Handle) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = e.cfg.Runtime.Freeze(ctx, h); err == nil {
			return nil
		}
		_ = e.cfg.Runtime.Thaw(context.WithoutCancel(ctx), h)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return err
}
