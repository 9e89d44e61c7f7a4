// Package snapshot is the edge's disk snapshots of sandboxes, written
// against the lifecycle core (the core implements Host and Sandbox; the
// image store is Layers, the snapshot records Store). A snapshot freezes
// the sandbox, copies its writable layer (a copy-on-write clone where the
// storage can: Cloner; else cp --reflink), thaws it and packs the copy
// into a content-addressed layer: only what changed since the sandbox's
// previous snapshot (diff.go), chained on that snapshot's layers. A VM's
// writable layer is streamed by its guest agent instead (vm.go); from the
// copy on, both tiers go the same way, so either tier's snapshot starts
// either. Restore fills a create from a snapshot record.
//
// Lock order: a sandbox's State.mu (one snapshot at a time, held over the
// freeze, the copy and the packing) comes before every lock the core takes
// in Sandbox.Source and the Host's methods (the core's sandbox.mu);
// nothing here is locked under those. The core's order is at the top of
// internal/edge/edge.go.
package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
	"github.com/warrenhq/warren/internal/scratch"
)

// Host is the core as snapshots see it.
type Host interface {
	Logger() *slog.Logger
	// CheckStorage refuses (an *api.Error) when project may not store n
	// more layers.
	CheckStorage(ctx context.Context, project string, n int64) error
	// Charge counts n stored bytes against project.
	Charge(ctx context.Context, project string, n int64)
}

// Store holds the snapshot records by id (the core's warren-snapshots
// bucket, bus.Records).
type Store interface {
	Get(ctx context.Context, key string, v any) (found bool, rev uint64, err error)
	Put(ctx context.Context, key string, v any) error
	Delete(ctx context.Context, key string) error
}

// Layers is the image store as snapshots use it.
type Layers interface {
	// MountLayers mounts the layers (diff ids) for holder and returns
	// their directories; ReleaseLayers drops holder's references.
	MountLayers(holder string, diffIDs []string) ([]string, error)
	ReleaseLayers(holder string)
	ResolveLayer(ctx context.Context, ref string) (*api.Layer, error)
	DeleteLayer(ctx context.Context, name string, version int) ([]api.Layer, error)
	// CreateLayerFromChanges packs a live writable layer, and
	// CreateLayerFromPrivateChanges a private copy of one (it may change
	// it); idBase is the host id of the sandbox's root.
	CreateLayerFromChanges(ctx context.Context, name string, version int, upper string, lowers []string, idBase uint32, source string) (*api.Layer, error)
	CreateLayerFromPrivateChanges(ctx context.Context, name string, version int, dir string, lowers []string, idBase uint32, source string) (*api.Layer, error)
}

// Freezer stops and restarts every process of a container (the runtime).
type Freezer interface {
	Freeze(ctx context.Context, h runtime.Handle) error
	Thaw(ctx context.Context, h runtime.Handle) error
}

// Cloner is writable-layer storage that can make a copy-on-write clone of
// a sandbox's writable directory (scratch on btrfs).
type Cloner interface {
	Clone(id string) (dir string, release func() error, err error)
	Flush(id string) error
}

// Sandbox is a sandbox of the core as a snapshot takes it.
type Sandbox interface {
	// Source reads what a snapshot needs of it (under its lock).
	Source() Source
	// SnapState is its snapshot state, which the core keeps with it.
	SnapState() *State
}

// Source is a sandbox as a snapshot reads it.
type Source struct {
	ID    string
	Layer string // its writable layer's name in the writable storage
	Upper string // its overlay upper directory ("": none to snapshot)
	// Lowers are the diff ids of the layers below its writable layer
	// (without layers bound at a path).
	Lowers []string
	Spec   api.CreateSandboxRequest
	Handle *runtime.Handle    // its container (nil: none)
	Agent  *agentproto.Client // its agent (nil: not running)
}

// State is one sandbox's snapshot state: its lock serializes the
// sandbox's snapshots; Last is its last one, for an incremental next one.
type State struct {
	mu   sync.Mutex
	last Last
}

// Config is what a Snapshotter works with.
type Config struct {
	Host    Host
	Store   Store
	Layers  Layers
	Runtime Freezer
	// Writable is the writable-layer storage; where it is a Cloner a
	// container's snapshot copies by cloning.
	Writable any
}

// Snapshotter takes and reads the node's snapshots.
type Snapshotter struct {
	cfg Config
	log *slog.Logger
}

// New returns the snapshotter of c.
func New(c Config) *Snapshotter { return &Snapshotter{cfg: c, log: c.Host.Logger()} }

func newSnapshotID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "snap-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// isVMTier reports whether tier runs sandboxes as VMs (whose disk the
// guest packs, vm.go).
func isVMTier(tier string) bool { return tier == api.TierMicroVM || tier == api.TierVM }

func invalidf(format string, a ...any) error {
	return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(format, a...)}
}

func conflictf(format string, a ...any) error {
	return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf(format, a...)}
}

// copied is a sandbox's writable layer as a snapshot copied it.
type copied struct {
	dir    string        // a private copy ("": none; layer was packed from the live one)
	layer  *api.Layer    // packed while frozen when the copy failed
	frozen time.Duration // how long the sandbox was frozen
	flush  time.Duration // the flush before the freeze
}

// Take snapshots sb: freezes it, copies its writable layer, thaws it,
// packs the copy into a new layer and records the snapshot (name, and
// step when a trajectory checkpoints). The caller holds the sandbox (the
// core's acquire: it stays running meanwhile).
func (s *Snapshotter) Take(ctx context.Context, sb Sandbox, name string, step int64) (*api.Snapshot, error) {
	st := sb.SnapState()
	st.mu.Lock()
	defer st.mu.Unlock()
	src := sb.Source()
	if src.Upper == "" || src.Handle == nil {
		return nil, conflictf("sandbox %s has no writable layer to snapshot", src.ID)
	}
	// A snapshot's layer counts against the project's storage quota: none
	// is taken once the project is at its quota.
	if err := s.cfg.Host.CheckStorage(ctx, src.Spec.Project, 1); err != nil {
		return nil, err
	}
	holder := src.ID + "/snapshot"
	lowers, err := s.cfg.Layers.MountLayers(holder, src.Lowers)
	if err != nil {
		return nil, err
	}
	defer s.cfg.Layers.ReleaseLayers(holder)

	snapID := newSnapshotID()
	var c copied
	if isVMTier(src.Spec.Tier) {
		// The guest packs its disk's changes (vm.go) into a private copy
		// beside the writable layer, as a container's is copied.
		c.dir = filepath.Join(filepath.Dir(filepath.Clean(src.Upper)), ".snapshot-"+snapID)
		defer os.RemoveAll(c.dir)
		if c.frozen, err = s.copyVMUpper(ctx, &src, c.dir, int64(src.Spec.DiskMB)<<20); err != nil {
			return nil, err
		}
	} else {
		var release func()
		c, release, err = s.copyContainer(ctx, &src, snapID, lowers)
		defer release()
		if err != nil {
			return nil, err
		}
	}
	return s.pack(ctx, st, &src, snapID, name, step, lowers, c)
}

// copyContainer copies container src's writable layer (see Take) and
// returns the copy and what removes it (always set).
func (s *Snapshotter) copyContainer(ctx context.Context, src *Source, snapID string, lowers []string) (copied, func(), error) {
	var c copied
	var cleanup []func()
	release := func() {
		for _, f := range cleanup {
			f()
		}
	}
	start := time.Now()
	cl, canClone := s.cfg.Writable.(Cloner)
	live := filepath.Clean(src.Upper)
	canClone = canClone && filepath.Base(live) == "upper"
	if canClone {
		// Write the sandbox's pending data out before freezing it: the
		// clone then has little to flush while it is frozen.
		if err := cl.Flush(src.Layer); err != nil {
			s.log.Warn("flush before snapshot", "sandbox", src.ID, "err", err)
		}
	}
	t0 := time.Now()
	c.flush = t0.Sub(start)
	if err := freeze(ctx, s.cfg.Runtime, *src.Handle); err != nil {
		return c, release, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("sandbox %s could not be frozen for the snapshot: %v", src.ID, err)}
	}
	// Frozen only while the writable layer is copied: a copy-on-write
	// snapshot of the sandbox's writable directory where its filesystem
	// can (btrfs: one ioctl), else a copy (cloning extents where it can);
	// packing the copy runs with the sandbox thawed. If the copy fails,
	// pack the live directory while frozen.
	var cerr error
	if canClone {
		var dir string
		var rel func() error
		if dir, rel, cerr = cl.Clone(src.Layer); cerr == nil {
			c.dir = filepath.Join(dir, "upper")
			cleanup = append(cleanup, func() {
				if err := rel(); err != nil {
					s.log.Warn("remove the snapshot's clone", "sandbox", src.ID, "err", err)
				}
			})
		} else if !errors.Is(cerr, scratch.ErrNoClone) {
			s.log.Warn("snapshot clone failed; copying", "sandbox", src.ID, "err", cerr)
		}
	}
	if c.dir == "" {
		// Beside the upper dir: the same filesystem, so the copy clones
		// extents (xfs) instead of copying data; it goes with the
		// sandbox's writable layer if warren dies before removing it.
		dir := filepath.Join(filepath.Dir(live), ".snapshot-"+snapID)
		if cerr = copyTree(ctx, live, dir); cerr == nil {
			c.dir = dir
			cleanup = append(cleanup, func() { _ = os.RemoveAll(dir) })
		} else {
			_ = os.RemoveAll(dir)
		}
	}
	var perr error
	if c.dir == "" {
		s.log.Warn("snapshot copy failed; packing while frozen", "sandbox", src.ID, "err", cerr)
		c.layer, perr = s.cfg.Layers.CreateLayerFromChanges(ctx, edgeproto.SnapshotLayerName(snapID), 1, live, lowers, src.Handle.IDBase, "snapshot of "+src.ID)
	}
	terr := s.cfg.Runtime.Thaw(context.WithoutCancel(ctx), *src.Handle)
	c.frozen = time.Since(t0)
	if terr != nil {
		return c, release, fmt.Errorf("thaw %s: %w", src.ID, terr)
	}
	return c, release, perr
}

// pack packs copy c of src's writable layer (unless it was packed
// already) as snapshot snapID and records it. The caller holds st.mu.
func (s *Snapshotter) pack(ctx context.Context, st *State, src *Source, snapID, name string, step int64, lowers []string, c copied) (*api.Snapshot, error) {
	t1 := time.Now()
	// The chain this snapshot's diff goes on: the previous snapshot of
	// the sandbox (only what changed since is packed), else its layers.
	chain := append([]api.LayerAttachment(nil), src.Spec.Layers...)
	var manifest Manifest
	var prev *api.Snapshot
	links := 1
	l := c.layer
	if c.dir != "" {
		var err error
		if manifest, prev, links, err = s.increment(ctx, st, src.ID, c.dir); err != nil {
			return nil, err
		}
		if prev != nil {
			chain = append([]api.LayerAttachment(nil), prev.Layers...)
		}
		if l, err = s.cfg.Layers.CreateLayerFromPrivateChanges(ctx, edgeproto.SnapshotLayerName(snapID), 1, c.dir, lowers, src.Handle.IDBase, "snapshot of "+src.ID); err != nil {
			return nil, err
		}
	}
	snap := newRecord(src, snapID, name, step, chain, l, c.frozen)
	if prev != nil {
		snap.Previous = prev.ID
	}
	if err := s.record(ctx, st, snap, prev != nil); err != nil {
		return nil, err
	}
	if manifest != nil {
		st.last = Last{Snap: snapID, Links: links, Manifest: manifest}
	} else {
		st.last = Last{} // packed from the live directory: the next one is full
	}
	s.cfg.Host.Charge(ctx, src.Spec.Project, snap.Size)
	s.log.Debug("snapshot", "sandbox", src.ID, "snapshot", snapID, "flush", c.flush, "frozen", c.frozen, "pack", time.Since(t1), "bytes", l.Size)
	return snap, nil
}

// newRecord is the record of snapshot snapID of src: chain, then its diff l.
func newRecord(src *Source, snapID, name string, step int64, chain []api.LayerAttachment, l *api.Layer, frozen time.Duration) *api.Snapshot {
	diff := fmt.Sprintf("%s@%d", l.Name, l.Version)
	snap := &api.Snapshot{
		ID: snapID, Name: name, Sandbox: src.ID, Project: src.Spec.Project, Image: src.Spec.Image,
		Layers: append(chain, api.LayerAttachment{Layer: diff}), Diff: diff,
		Digest: l.Digest, Size: l.Size, Entries: l.Entries, Parent: src.Spec.Snapshot, Step: step,
		FrozenMs: float64(frozen.Microseconds()) / 1000, CreatedAt: time.Now().UTC(),
	}
	if step > 0 {
		snap.Trajectory = src.Spec.Trajectory
	}
	return snap
}

// record stores snap; chained says it chains on a previous snapshot,
// which must still be whole. The caller holds st.mu.
func (s *Snapshotter) record(ctx context.Context, st *State, snap *api.Snapshot, chained bool) error {
	if err := s.cfg.Store.Put(ctx, snap.ID, snap); err != nil {
		return err
	}
	if !chained {
		return nil
	}
	// The previous snapshot may have been deleted while this one was
	// packed, and with it a diff nobody else needed yet: this one must not
	// name a layer that is gone.
	if err := s.chainWhole(ctx, snap); err != nil {
		st.last = Last{}
		_ = s.cfg.Store.Delete(context.WithoutCancel(ctx), snap.ID)
		_, _ = s.cfg.Layers.DeleteLayer(context.WithoutCancel(ctx), edgeproto.SnapshotLayerName(snap.ID), 0)
		return conflictf("snapshot of %s: %v while it was taken; take it again (it will be full)", snap.Sandbox, err)
	}
	return nil
}

// increment prepares dir, a private copy of a sandbox's writable layer, to
// be packed: against the sandbox's previous snapshot when it has one that
// still exists and its chain is not long yet (only what changed since is
// left), else whole. It returns the manifest of the layer for the next
// snapshot (nil if it could not be read: the next one is full), the
// snapshot this one chains on (nil = a full one) and its link count.
// The caller holds st.mu.
func (s *Snapshotter) increment(ctx context.Context, st *State, id, dir string) (Manifest, *api.Snapshot, int, error) {
	last := st.last
	if last.Snap != "" && last.Manifest != nil && last.Links < MaxChainLinks {
		prev, err := s.Get(ctx, last.Snap)
		if err == nil && len(prev.Layers) < sandboxspec.MaxLayers {
			manifest, err := PruneUnchanged(dir, last.Manifest)
			if err != nil {
				// The copy may be half pruned: it is neither whole nor
				// the diff.
				st.last = Last{}
				return nil, nil, 0, fmt.Errorf("incremental snapshot of %s: %w", id, err)
			}
			return manifest, prev, last.Links + 1, nil
		}
	}
	manifest, err := ScanManifest(dir)
	if err != nil {
		s.log.Warn("snapshot manifest; the next snapshot is full", "sandbox", id, "err", err)
		return nil, nil, 1, nil
	}
	return manifest, nil, 1, nil
}

// chainWhole checks that every snapshot diff snap chains on still exists.
func (s *Snapshotter) chainWhole(ctx context.Context, snap *api.Snapshot) error {
	for _, l := range snap.Layers[:len(snap.Layers)-1] {
		if !strings.HasPrefix(l.Layer, "snap/") {
			continue
		}
		if _, err := s.cfg.Layers.ResolveLayer(ctx, l.Layer); err != nil {
			return fmt.Errorf("layer %s of the previous snapshot was deleted", l.Layer)
		}
	}
	return nil
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

// freeze stops every process of the container h, retrying a freeze that
// does not settle (a busy sandbox on a loaded node); a failed attempt is
// thawed, so no process stays stopped.
func freeze(ctx context.Context, rt Freezer, h runtime.Handle) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = rt.Freeze(ctx, h); err == nil {
			return nil
		}
		_ = rt.Thaw(context.WithoutCancel(ctx), h)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return err
}
