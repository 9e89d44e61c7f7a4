package edge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/recycle"
	"github.com/warrenhq/warren/internal/edge/trajectory"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// startTimeout bounds how long a sandbox may take to come up.
const startTimeout = 60 * time.Second

// vmStartTimeout bounds a vm tier sandbox's start: a disk image boots its
// own firmware, bootloader, kernel and init (systemd), which under TCG
// takes a minute or more.
const vmStartTimeout = 4 * time.Minute

// checkDiskImage refuses what a VM disk image (img.Disk) cannot do: boot
// on another tier than vm, or take named layers.
func checkDiskImage(spec *api.CreateSandboxRequest, img *ResolvedImage) error {
	if img.Disk == "" {
		return nil
	}
	if spec.Tier != api.TierVM {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("image %q is a VM disk image: create it with tier %q", spec.Image, api.TierVM)}
	}
	if len(spec.Layers) > 0 {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("image %q is a VM disk image: it takes no layers", spec.Image)}
	}
	return nil
}

func (e *Edge) create(ctx context.Context, req *CreateRequest) (*api.Sandbox, error) {
	spec := req.Spec
	if aerr := sandboxspec.Normalize(&spec); aerr != nil {
		return nil, aerr
	}
	snap, err := e.fromSnapshot(ctx, &spec)
	if err != nil {
		return nil, err
	}
	id := req.ID
	if id == "" {
		id = e.newID()
	} else if NodeOf(id) != e.cfg.Node {
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("sandbox id %q does not belong to node %s", id, e.cfg.Node)}
	}

	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	if existing, ok := e.sandboxes[id]; ok {
		e.mu.Unlock()
		<-existing.ready
		if existing.createErr != nil {
			return nil, existing.createErr
		}
		v := existing.view()
		return &v, nil
	}
	if sb := e.claimLocked(id, &spec); sb != nil {
		// A warm pool member takes this id: no admission (it was admitted
		// when the pool made it), no start.
		e.mu.Unlock()
		sb.mu.Lock()
		rec := sb.rec
		sb.mu.Unlock()
		if err := e.persist(&rec); err != nil {
			e.stop(ctx, sb, api.StateFailed, "cannot persist the record")
			return nil, err
		}
		v := sb.view()
		return &v, nil
	}
	if aerr := e.admitLocked(&spec); aerr != nil {
		e.mu.Unlock()
		return nil, aerr
	}
	sb := e.newSandbox(id, &spec)
	e.putLocked(id, sb)
	e.mu.Unlock()

	if err = e.bringUp(ctx, sb, req.FromStep, snap); err != nil {
		if spec.Trajectory != "" && !spec.Resume {
			e.trajs.Unregister(ctx, id, &spec)
		}
		sb.createErr = err
		e.mu.Lock()
		e.dropLocked(id)
		e.mu.Unlock()
		close(sb.ready)
		return nil, err
	}
	close(sb.ready)
	v := sb.view()
	return &v, nil
}

// newSandbox is the new sandbox id of spec, creating.
func (e *Edge) newSandbox(id string, spec *api.CreateSandboxRequest) *sandbox {
	now := time.Now().UTC()
	expires := now.Add(time.Duration(spec.TTL) * time.Second)
	return &sandbox{
		rec: record{
			Spec: *spec,
			Sandbox: api.Sandbox{
				ID: id, State: api.StateCreating, Node: e.cfg.Node, Project: spec.Project, Tier: spec.Tier, Display: spec.Display, Image: spec.Image,
				CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, Pids: spec.Pids,
				Labels: copyMap(spec.Labels), User: spec.User, TTL: spec.TTL, IdleTimeout: spec.IdleTimeout,
				Priority: spec.Priority, IdleAction: spec.IdleTimeoutAction,
				Snapshot: spec.Snapshot, Trajectory: spec.Trajectory,
				CreatedAt: now, ExpiresAt: &expires,
			},
		},
		lastActive: now,
		ready:      make(chan struct{}),
		traj:       trajectory.New(spec),
	}
}

// bringUp claims the new sandbox's trajectory name and starts it; a
// rebuild of a lost trajectory sandbox (resume) then serves the log up to
// the state it was rebuilt from: a checkpoint snapshot (snap), or the
// original state (step fromStep, 0).
func (e *Edge) bringUp(ctx context.Context, sb *sandbox, fromStep int64, snap *api.Snapshot) error {
	spec := &sb.rec.Spec // fixed while it is creating
	if err := e.trajs.Register(ctx, sb.rec.Sandbox.ID, spec); err != nil {
		return err
	}
	if err := e.start(ctx, sb); err != nil {
		return err
	}
	if spec.Trajectory == "" || !spec.Resume {
		return nil
	}
	if snap != nil && snap.Trajectory == spec.Trajectory {
		fromStep = snap.Step
	}
	if err := e.trajs.Rebuild(ctx, e.trajSandbox(sb), fromStep, spec.Branch); err != nil {
		e.stop(ctx, sb, api.StateFailed, "rebuild: "+err.Error())
		return err
	}
	return nil
}

// pressureFor is how long a reading of the host's pressure is reused:
// reading /proc/meminfo, loadavg, two sysctls and PSI on every create cost
// more than the rest of admission, and they do not move in 100 ms.
const pressureFor = 100 * time.Millisecond

// pressure refuses new work while the host itself is short of memory or pids,
// whatever the requests add up to: overcommitted requests are only a
// promise, MemAvailable and PSI are what the kernel sees. Called with e.mu
// held; the answer is reused for pressureFor.
func (e *Edge) pressure() *api.Error {
	now := time.Now()
	if !e.pressureAt.IsZero() && now.Sub(e.pressureAt) < pressureFor {
		return e.pressureErr
	}
	e.pressureAt, e.pressureErr = now, e.readPressure()
	return e.pressureErr
}

func (e *Edge) readPressure() *api.Error {
	if e.cfg.MinMemoryAvailableMB > 0 {
		if m, err := hoststat.ReadMemory(); err == nil && m.Available>>20 < e.cfg.MinMemoryAvailableMB {
			return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonMemPressure, Message: fmt.Sprintf(
				"node %s is under memory pressure: %d MiB available, below the %d MiB reserve",
				e.cfg.Node, m.Available>>20, e.cfg.MinMemoryAvailableMB)}
		}
	}
	if e.cfg.DiskSpace != nil && e.cfg.MinDiskAvailableMB > 0 {
		if _, avail, err := e.cfg.DiskSpace(); err == nil && avail < e.cfg.MinDiskAvailableMB {
			return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonDisk, Message: fmt.Sprintf(
				"node %s is out of disk: %d MiB free on the scratch filesystem, below the %d MiB reserve",
				e.cfg.Node, avail, e.cfg.MinDiskAvailableMB)}
		}
	}
	if e.cfg.MinFreeTasks > 0 {
		if t, err := hoststat.ReadTasks(); err == nil && t.Limit-t.Used < e.cfg.MinFreeTasks {
			return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonPids, Message: fmt.Sprintf(
				"node %s is out of pids: %d of %d tasks in use (kernel.pid_max / threads-max), fewer than %d left",
				e.cfg.Node, t.Used, t.Limit, e.cfg.MinFreeTasks)}
		}
	}
	if e.cfg.MaxMemoryPressure > 0 {
		if p, err := hoststat.ReadPressure("memory"); err == nil && p.Avg10 > e.cfg.MaxMemoryPressure {
			return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonMemPressure, Message: fmt.Sprintf(
				"node %s is under memory pressure: PSI some avg10 %.1f%% above %.1f%%",
				e.cfg.Node, p.Avg10, e.cfg.MaxMemoryPressure)}
		}
	}
	return nil
}

// rootLayers is what a sandbox's root is made of.
type rootLayers struct {
	img *ResolvedImage
	// ids are the root's layers (diff ids, top-most first), then the
	// bound layers' (one per bind, in order); names describe them for the
	// record.
	ids, names []string
	binds      []agentproto.Bind
}

// resolveRoot resolves spec's image and named layers (pinning the layers'
// versions in spec): named layers are stacked above the image (bottom
// first in the request), or attached at mount points.
func (e *Edge) resolveRoot(ctx context.Context, spec *api.CreateSandboxRequest) (*rootLayers, error) {
	img, err := e.cfg.Images.ResolveLayers(ctx, spec.Image)
	if err != nil {
		if errors.Is(err, ErrImageNotFound) {
			return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("image %q not found", spec.Image)}
		}
		return nil, fmt.Errorf("resolve image %s: %w", spec.Image, err)
	}
	if err := checkDiskImage(spec, img); err != nil {
		return nil, err
	}
	var rootIDs, bindIDs, names []string
	var binds []agentproto.Bind
	for i, a := range spec.Layers {
		l, err := e.resolveLayer(ctx, a.Layer)
		if err != nil {
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
				return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", a.Layer)}
			}
			return nil, fmt.Errorf("resolve layer %s: %w", a.Layer, err)
		}
		desc := fmt.Sprintf("%s@%d", l.Name, l.Version)
		spec.Layers[i].Layer = desc // pinned: snapshots record exact versions
		if a.Mount == "" {
			rootIDs = append(rootIDs, l.Digest)
		} else {
			bindIDs = append(bindIDs, l.Digest)
			binds = append(binds, agentproto.Bind{Target: a.Mount, Protected: a.Protected})
			desc += " at " + a.Mount
			if a.Protected {
				desc += " (protected)"
			}
		}
		names = append(names, desc)
	}
	layerIDs := make([]string, 0, len(rootIDs)+len(img.Layers)+len(bindIDs))
	for i := len(rootIDs) - 1; i >= 0; i-- {
		layerIDs = append(layerIDs, rootIDs[i])
	}
	layerIDs = append(layerIDs, img.Layers...)
	// The same content twice in the root's chain (two snapshot diffs that
	// changed nothing, a layer also in the image): overlayfs refuses a
	// layer that is below itself (ELOOP), and the lower copy adds nothing
	// that the upper one does not already show or hide.
	layerIDs = topmostOnce(layerIDs)
	return &rootLayers{img: img, ids: append(layerIDs, bindIDs...), names: names, binds: binds}, nil
}

// takeRecycled takes a recycled container of sb's shape
// (internal/edge/recycle) when one waits. Its fresh root serves as it is
// when it has the same layers and disk limit: then it is resumed with
// spec's environment and user, and sb has started (done; err says how
// the start ended). Else box, when not nil, is to be rerooted into the
// root the caller makes.
func (e *Edge) takeRecycled(ctx context.Context, sb *sandbox, root *rootLayers, rs *runtime.Spec, t0 time.Time) (box *recycle.Box, done bool, err error) {
	spec := &sb.rec.Spec
	if len(root.binds) != 0 || sb.stateless || root.img.Disk != "" || !e.shelf.Enabled() {
		return nil, false, nil
	}
	key := recycle.RootKey(root.ids, spec.DiskMB)
	if box = e.shelf.Take(spec, key); box == nil || box.Root != key {
		return box, false, nil
	}
	inst := e.shelf.Resume(ctx, box, rs)
	if inst == nil {
		return nil, false, nil
	}
	sb.mu.Lock()
	sb.rec.Storage, sb.rec.Layer = box.Store, box.Layer
	sb.rec.Layers, sb.rec.Upper, sb.rec.Binds = root.ids, box.Upper, nil
	sb.rec.Sandbox.Layers = root.names
	sb.mu.Unlock()
	if err := e.started(ctx, sb, inst, t0); err != nil {
		e.freeStorage(box.Store, box.Layer)
		return nil, true, err
	}
	return nil, true, nil
}

func (e *Edge) start(ctx context.Context, sb *sandbox) (err error) {
	spec := &sb.rec.Spec
	id := sb.rec.storage()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeoutOf(spec.Tier))
	defer cancel()
	t0 := time.Now()
	root, err := e.resolveRoot(ctx, spec)
	if err != nil {
		return err
	}
	img, layerIDs, names, binds := root.img, root.ids, root.names, root.binds
	env := sandboxEnv(img.Env, spec.Env)
	user := spec.User
	if user == "" {
		user = img.User // the image's USER
	}
	// The network first: a recycled networked container resumes with it.
	rnet, err := e.startNetwork(spec)
	if err != nil {
		return err
	}
	box, done, err := e.takeRecycled(ctx, sb, root, &runtime.Spec{ID: id, Env: env, User: user, Cwd: img.WorkingDir, Network: rnet}, t0)
	if done {
		return err
	}
	store := id // the container's name (a recycled one's once rerooted); the writable layer's is id
	defer func() {
		if err != nil {
			if box != nil {
				e.shelf.Discard(box)
			}
			e.freeStorage(store, id)
		}
	}()
	upper, work, err := e.allocWritable(id, spec.DiskMB)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.rec.Layers = layerIDs
	sb.rec.Upper = upper
	sb.rec.Binds = binds
	sb.rec.Sandbox.Layers = names
	sb.mu.Unlock()
	// The record is written once the sandbox runs. Until then a crash
	// leaves only unrecorded storage, which reconcile frees at the next
	// start like any leftover.
	dirs, err := e.cfg.Images.MountLayers(id, layerIDs)
	if err != nil {
		return fmt.Errorf("mount layers: %w", err)
	}
	nRoot := len(layerIDs) - len(binds)
	lowers := dirs[:nRoot]
	for i := range binds {
		binds[i].Source = dirs[nRoot+i]
	}
	stateDir := e.stateDir(id)
	rspec := &runtime.Spec{
		ID: id, Hostname: spec.Hostname, StateDir: stateDir, RootDir: filepath.Join(stateDir, "root"),
		Lowers: lowers, Binds: binds, Upper: upper, Work: work,
		CPU: spec.CPU, MemoryMB: spec.MemoryMB, Pids: spec.Pids, DiskMB: spec.DiskMB,
		Env: env, User: user, Cwd: img.WorkingDir, Priority: spec.Priority, Tier: spec.Tier, Display: spec.Display,
		Disk: img.Disk,
	}
	if sb.stateless {
		rspec.Stateless = FnCallDirs
	}
	rspec.Network = rnet
	inst, rerooted, err := e.launch(ctx, sb, box, rspec)
	box = nil // launch took it
	if rerooted != "" {
		store = rerooted
	}
	if err != nil {
		return err
	}
	return e.started(ctx, sb, inst, t0)
}

// startTimeoutOf is how long a sandbox of tier may take to start: a whole
// OS booting from its disk image takes longer.
func startTimeoutOf(tier string) time.Duration {
	if tier == api.TierVM {
		return vmStartTimeout
	}
	return startTimeout
}

// startNetwork is the runtime's network of spec (nil: none).
func (e *Edge) startNetwork(spec *api.CreateSandboxRequest) (*runtime.NetworkSpec, error) {
	n, err := e.rules.Resolve(spec.Network, false)
	if err != nil || n == nil {
		return nil, err
	}
	if spec.Network.Group != "" {
		// Per project: two projects' groups of one name are two groups.
		n.Group = spec.Project + "\x00" + spec.Network.Group
	}
	n.EgressRateMbit = spec.Network.EgressRateMbit
	n.IngressRateMbit = spec.Network.IngressRateMbit
	n.MaxConns = spec.Network.MaxConns
	return n, nil
}

// launch starts sb's container from rspec: the recycled box rerooted into
// rspec's root when there is one and that works (rerooted names the
// container then: box's name), else a new container.
func (e *Edge) launch(ctx context.Context, sb *sandbox, box *recycle.Box, rspec *runtime.Spec) (inst *runtime.Instance, rerooted string, err error) {
	id := rspec.ID
	if box != nil {
		if inst = e.shelf.Reroot(ctx, box, rspec); inst != nil {
			sb.mu.Lock()
			sb.rec.Storage, sb.rec.Layer = box.Store, id
			sb.mu.Unlock()
			return inst, box.Store, nil
		}
		// The work dir of a volatile overlay that was mounted is refused
		// by the next mount: start it again.
		_ = os.RemoveAll(rspec.Work)
		if err := os.Mkdir(rspec.Work, 0o755); err != nil {
			return nil, "", fmt.Errorf("prepare %s: %w", rspec.Work, err)
		}
	}
	if err := os.MkdirAll(rspec.RootDir, 0o755); err != nil {
		return nil, "", fmt.Errorf("prepare %s: %w", rspec.RootDir, err)
	}
	inst, err = e.cfg.Runtime.Start(ctx, rspec)
	if err != nil {
		_ = e.cfg.Runtime.Destroy(context.WithoutCancel(ctx), runtime.Handle{ID: id, Tier: rspec.Tier, Socket: filepath.Join(rspec.StateDir, "agent.sock")})
		return nil, "", startError(err)
	}
	return inst, "", nil
}

// startError is the API error of a sandbox that failed to start: the
// agent's refusal of the request itself (a user the image does not know)
// is the client's (400), anything else the node's (503).
func startError(err error) *api.Error {
	var ae *agentproto.Error
	if errors.As(err, &ae) && (ae.Code == agentproto.ErrNotFound || ae.Code == agentproto.ErrInvalid) {
		return &api.Error{Code: api.CodeBadRequest, Message: "sandbox cannot start: " + ae.Message}
	}
	return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("sandbox failed to start: %v", err)}
}

// started makes sb running in inst, records it and watches its agent. On
// an error the caller frees the storage; started destroys the container.
func (e *Edge) started(ctx context.Context, sb *sandbox, inst *runtime.Instance, t0 time.Time) error {
	pooled := sb.pool != "" // pool members get a record only when claimed
	sb.mu.Lock()
	sb.inst = inst
	h := inst.Handle
	sb.rec.Handle = &h
	sb.rec.CPUBase = e.cpuBaseline(&sb.rec, h)
	sb.rec.Sandbox.State = api.StateRunning
	sb.lastActive = time.Now()
	sb.rec.Sandbox.LastActive = sb.lastActive // the idle clock survives a restart (reap's flushActivity)
	e.cpuOpenLocked(sb)
	rec := sb.rec
	sb.mu.Unlock()
	sb.audit.SetPolicy(rec.Spec.Audit)
	e.auditStart(sb, h)
	if !pooled {
		if err := e.persist(&rec); err != nil {
			e.auditStop(sb)
			_ = inst.Agent.Close()
			_ = e.cfg.Runtime.Destroy(context.WithoutCancel(ctx), h)
			return err
		}
	}
	e.watch(sb)
	e.log.Debug("sandbox started", "id", rec.Sandbox.ID, "container", rec.storage(), "took", time.Since(t0))
	return nil
}

// DefaultPath is the PATH of a sandbox whose image sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sandboxEnv merges the image's environment, then the create request's.
func sandboxEnv(image []string, req map[string]string) map[string]string {
	env := map[string]string{"PATH": DefaultPath, "HOME": "/root", "TERM": "xterm"}
	for _, kv := range image {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	for k, v := range req {
		env[k] = v
	}
	return env
}

// BatchParallelism bounds how many sandboxes of one batch start at once.
var BatchParallelism = 16

// createBatch creates every item, answering each on its own.
func (e *Edge) createBatch(ctx context.Context, req *CreateBatchRequest) *CreateBatchResult {
	out := &CreateBatchResult{Items: make([]CreateBatchItem, len(req.Items))}
	sem := make(chan struct{}, BatchParallelism)
	var wg sync.WaitGroup
	for i := range req.Items {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := e.create(ctx, &req.Items[i])
			if err != nil {
				var ae *api.Error
				if !errors.As(err, &ae) {
					ae = &api.Error{Code: api.CodeInternal, Message: err.Error()}
				}
				out.Items[i].Error = ae
				return
			}
			out.Items[i].Sandbox = sb
		}(i)
	}
	wg.Wait()
	return out
}

// topmostOnce keeps the first (top-most) occurrence of each layer id.
func topmostOnce(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
