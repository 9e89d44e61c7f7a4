package apiserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Ownership. Every object records its project (sandboxes, trajectories,
// snapshots, layers, pools; commands and events through their sandbox),
// and every route asks iam.Principal.Sees, through own, before it reads,
// uses, changes or lists one. An object the caller may not see is
// answered as missing (404), never as forbidden, so its name tells a
// sibling project nothing. test/e2e/ownership_test.go walks every route of
// api/openapi.yaml with a sibling project's token.

// own answers missing (a 404) unless p may see an object of kind owned by
// project owner.
func own(p *iam.Principal, kind, owner string, missing error) error {
	if p.Sees(kind, owner) {
		return nil
	}
	return missing
}

// ownChange is own for a change (delete, new version): the caller must see
// the object and may change it (the shared catalog is root's).
func ownChange(p *iam.Principal, kind, owner string, missing error) error {
	if err := own(p, kind, owner, missing); err != nil {
		return err
	}
	if !p.Changes(kind, owner) {
		return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("this %s belongs to the shared catalog: only a root token changes it", kind)}
	}
	return nil
}

// limitsOf lists the quotas that bind a sandbox of project.
func (s *Server) limitsOf(project string) []placement.Limit {
	var limits []placement.Limit
	for _, l := range s.cfg.IAM.Chain(project) {
		limits = append(limits, placement.Limit{Project: l.Project, Quota: l.Quota})
	}
	return limits
}

// placeError turns a placement failure into its answer: a quota is 403
// (429 while placements in flight may still be released), no node 503
// naming what (and the short resource).
func placeError(err error, what string) error {
	var qe *placement.QuotaError
	if errors.As(err, &qe) {
		if qe.Transient {
			return &api.Error{Code: api.CodeTooManyRequests, Message: qe.Error()}
		}
		return &api.Error{Code: api.CodeForbidden, Message: qe.Error()}
	}
	if errors.Is(err, placement.ErrNoNode) {
		return noNode(err, what)
	}
	return err
}

// snapshotOf reads snapshot sid for p: 404 when it does not exist or p may
// not see it.
func (s *Server) snapshotOf(ctx context.Context, p *iam.Principal, sid string) (*api.Snapshot, error) {
	if !sandboxspec.ValidSnapshotID(sid) {
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("snapshot %q is malformed", truncate(sid))}
	}
	missing := &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("snapshot %s not found", sid)}
	var snap api.Snapshot
	found, _, err := s.snaps.Get(ctx, sid, &snap)
	if err != nil {
		return nil, storeUnavailable("the snapshot store", err)
	}
	if !found {
		return nil, missing
	}
	if err := own(p, iam.KindSnapshot, snap.Project, missing); err != nil {
		return nil, err
	}
	return &snap, nil
}

// layerOwner is the project that owns named layer name: a snapshot's
// layer (snap/<id>) belongs to the snapshot's project, any other layer to
// the project that first made a version of it ("" = a root token, or made
// before layers had owners: the shared catalog). snapshot reports whether
// the name is a snapshot's, exists whether its owner is known.
func (s *Server) layerOwner(ctx context.Context, name string) (owner string, snapshot, exists bool, err error) {
	if sid, ok := strings.CutPrefix(name, "snap/"); ok {
		var snap api.Snapshot
		found, _, gerr := s.snaps.Get(ctx, sid, &snap)
		if gerr != nil {
			return "", true, false, storeUnavailable("the snapshot store", gerr)
		}
		if !found {
			// A snapshot layer without its snapshot is nobody's but root's.
			return "\x00", true, false, nil
		}
		return snap.Project, true, true, nil
	}
	var rec layerOwnerRecord
	found, _, gerr := s.layerOwners.Get(ctx, name, &rec)
	if gerr != nil {
		return "", false, false, storeUnavailable("the layer owner store", gerr)
	}
	return rec.Project, false, found, nil
}

// layerOwnerRecord is a layer name's entry in the owners bucket.
type layerOwnerRecord struct {
	Project string `json:"project"`
}

// Layer names are unique per project, not global: p1 and p2 may each
// have a ws/calc. The store keeps a project's layer under its qualified
// name (api.QualifiedLayerName: "~p1/ws/calc"; the root project's, the
// shared catalog, and every layer made before names were per project
// under the plain name), and the owners bucket indexes which project has
// which name (key edgeproto.TrajKey(project, name); a plain name's record
// keeps the owner it had before). A client names a layer by its plain
// name: it means its project's own layer of that name, else its parent's,
// and so on up to the shared catalog (resolveLayerName). A name only
// another project has is answered as one nobody has.

// resolvedLayer is what a layer name means for a project.
type resolvedLayer struct {
	stored string // the store's name
	name   string // the name its project uses
	owner  string
	snap   bool // a snapshot's layer (snap/<id>), owned as the snapshot
	// known: its owner is recorded (the index, a snapshot); else it is
	// the shared catalog's or nobody's, as the store says.
	known bool
}

// resolveLayerName finds what layer name (no version) means for a
// sandbox of project: its own layer of that name, else its nearest
// ancestor's, else the plain name (the shared catalog, or a layer made
// before names were per project, owned as its record says). A qualified
// name means itself.
func (s *Server) resolveLayerName(ctx context.Context, project, name string) (resolvedLayer, error) {
	if owner, rest := api.SplitLayerName(name); owner != "" {
		return resolvedLayer{stored: name, name: rest, owner: owner, known: true}, nil
	}
	if !strings.HasPrefix(name, "snap/") {
		for q := project; q != ""; q = parentProject(q) {
			var rec layerOwnerRecord
			found, _, err := s.layerOwners.Get(ctx, edgeproto.TrajKey(q, name), &rec)
			if err != nil {
				return resolvedLayer{}, storeUnavailable("the layer owner store", err)
			}
			if !found {
				continue
			}
			// The index may name a layer whose versions are gone (a
			// failed first upload, a crash between delete and forget):
			// the store decides.
			stored := api.QualifiedLayerName(q, name)
			if has, err := s.storeHas(ctx, stored); err != nil {
				return resolvedLayer{}, err
			} else if has {
				return resolvedLayer{stored: stored, name: name, owner: q, known: true}, nil
			}
		}
	}
	owner, snap, known, err := s.layerOwner(ctx, name)
	if err != nil {
		return resolvedLayer{}, err
	}
	return resolvedLayer{stored: name, name: name, owner: owner, snap: snap, known: known}, nil
}

// parentProject is project's parent ("" for a top-level project).
func parentProject(project string) string {
	if i := strings.LastIndexByte(project, '.'); i >= 0 {
		return project[:i]
	}
	return ""
}

// layerNotFound is the one answer for a layer the caller may not see and
// for one that does not exist.
func layerNotFound(ref string) error {
	return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", truncate(ref))}
}

// resolveLayerRef resolves ref ("name" or "name@3") for p, as a sandbox
// of project would use it: the store's reference, and what it resolved to.
func (s *Server) resolveLayerRef(ctx context.Context, p *iam.Principal, project, ref string) (string, resolvedLayer, error) {
	name, v, err := api.ParseLayerRef(ref)
	if err != nil {
		return "", resolvedLayer{}, invalid("%s", strings.TrimPrefix(err.Error(), "invalid: "))
	}
	rl, err := s.resolveLayerName(ctx, project, name)
	if err != nil {
		return "", rl, err
	}
	if err := own(p, layerKind(rl.snap), rl.owner, layerNotFound(ref)); err != nil {
		return "", rl, err
	}
	stored := rl.stored
	if v > 0 {
		stored += "@" + strconv.Itoa(v)
	}
	return stored, rl, nil
}

// claimLayerName records that project has layer name (a new version of it
// is about to be made) and returns the store's name for it. A project's
// names are its own: only the root project's plain names are shared, and
// only root changes those.
func (s *Server) claimLayerName(ctx context.Context, p *iam.Principal, name, project string) (string, error) {
	if strings.HasPrefix(name, "snap/") {
		return "", &api.Error{Code: api.CodeInvalid, Message: "layer names under snap/ are snapshots'; choose another name"}
	}
	if strings.HasPrefix(name, "~") {
		return "", invalid("layer name %q: a new layer is named without its project (it is made in the project of the token or sandbox)", truncate(name))
	}
	if project == "" {
		return name, s.claimCatalogName(ctx, p, name)
	}
	key := edgeproto.TrajKey(project, name)
	var rec layerOwnerRecord
	found, _, err := s.layerOwners.Get(ctx, key, &rec)
	if err != nil {
		return "", storeUnavailable("the layer owner store", err)
	}
	if !found {
		if cerr := s.layerOwners.Create(ctx, key, &layerOwnerRecord{Project: project}); cerr != nil {
			// Another request claimed it first, or the store failed.
			if found, _, gerr := s.layerOwners.Get(ctx, key, &rec); gerr != nil || !found {
				return "", storeUnavailable("the layer owner store", cerr)
			}
		}
	}
	return api.QualifiedLayerName(project, name), nil
}

// claimCatalogName checks a new version of a root project's plain name:
// one made by a project before names were per project stays its.
func (s *Server) claimCatalogName(ctx context.Context, p *iam.Principal, name string) error {
	owner, _, exists, err := s.layerOwner(ctx, name)
	if err != nil {
		return err
	}
	if exists {
		return ownChange(p, iam.KindLayer, owner, layerNotFound(name))
	}
	return ownChange(p, iam.KindLayer, "", layerNotFound(name))
}

// storeHas reports whether the store has a version of layer stored.
func (s *Server) storeHas(ctx context.Context, stored string) (bool, error) {
	var l api.LayerList
	if err := s.callStore(ctx, edgeproto.OpLayerList, &edgeproto.LayerRequest{Name: stored}, &l); err != nil {
		return false, err
	}
	return len(l.Layers) > 0, nil
}

// forgetLayerName drops project's name from the index once the store has
// no version of it left (deleteLayer), so that the name resolves to an
// ancestor's again.
func (s *Server) forgetLayerName(ctx context.Context, rl resolvedLayer) {
	if rl.snap || rl.owner == "" || rl.stored != api.QualifiedLayerName(rl.owner, rl.name) {
		return
	}
	if has, err := s.storeHas(ctx, rl.stored); err != nil || has {
		return
	}
	_ = s.layerOwners.Delete(ctx, edgeproto.TrajKey(rl.owner, rl.name))
}

// showLayer turns a store's layer into what p is shown: its project's
// name and its owner; a layer seen from below (an ancestor's, the shared
// catalog) without its source, which names the owner's sandboxes.
func showLayer(p *iam.Principal, l *api.Layer, owner string) {
	_, l.Name = api.SplitLayerName(l.Name)
	l.Project = owner
	if !p.InScope(owner) {
		l.Source = ""
	}
}

// checkSpecUses refuses a create whose snapshot or layers p may not see.
func (s *Server) checkSpecUses(ctx context.Context, p *iam.Principal, spec *api.CreateSandboxRequest) error {
	if spec.Snapshot != "" {
		if _, err := s.snapshotOf(ctx, p, spec.Snapshot); err != nil {
			return err
		}
	}
	for i, a := range spec.Layers {
		if _, _, err := api.ParseLayerRef(a.Layer); err != nil {
			continue // the edge answers a malformed reference
		}
		// The edge gets the store's name: it checks that a qualified name
		// is the sandbox's project's or an ancestor's (edge.resolveLayer).
		stored, _, err := s.resolveLayerRef(ctx, p, spec.Project, a.Layer)
		if err != nil {
			return err
		}
		spec.Layers[i].Layer = stored
	}
	return nil
}

// layerKind is the kind whose rule a layer follows: a snapshot's layer is
// the snapshot (never the shared catalog, even when root made it).
func layerKind(snapshot bool) string {
	if snapshot {
		return iam.KindSnapshot
	}
	return iam.KindLayer
}
