package apiserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image"
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

// checkLayerUse refuses a layer reference p may not see (404).
func (s *Server) checkLayerUse(ctx context.Context, p *iam.Principal, ref string) error {
	name, _, err := image.ParseLayerRef(ref)
	if err != nil {
		return nil // the edge answers a malformed reference
	}
	owner, snap, _, err := s.layerOwner(ctx, name)
	if err != nil {
		return err
	}
	return own(p, layerKind(snap), owner, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", truncate(ref))})
}

// claimLayerName makes project the owner of layer name unless it has one;
// a name another project owns is refused as missing (404) when p cannot
// see it, 403 when it is the shared catalog.
func (s *Server) claimLayerName(ctx context.Context, p *iam.Principal, name, project string) error {
	missing := &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q belongs to a project you cannot see; choose another name", truncate(name))}
	owner, snap, exists, err := s.layerOwner(ctx, name)
	if err != nil {
		return err
	}
	if snap {
		return &api.Error{Code: api.CodeInvalid, Message: "layer names under snap/ are snapshots'; choose another name"}
	}
	if exists {
		return ownChange(p, iam.KindLayer, owner, missing)
	}
	// A name with versions but no owner was made before layers had owners:
	// it stays the shared catalog's, which only root changes.
	var l api.LayerList
	if err := s.callStore(ctx, edge.OpLayerList, &edge.LayerRequest{Name: name}, &l); err != nil {
		return err
	}
	for _, x := range l.Layers {
		if x.Name == name {
			return ownChange(p, iam.KindLayer, "", missing)
		}
	}
	if cerr := s.layerOwners.Create(ctx, name, &layerOwnerRecord{Project: project}); cerr != nil {
		// Another request claimed it first: decide by its owner.
		var rec layerOwnerRecord
		found, _, gerr := s.layerOwners.Get(ctx, name, &rec)
		if gerr != nil || !found {
			return storeUnavailable("the layer owner store", cerr)
		}
		return ownChange(p, iam.KindLayer, rec.Project, missing)
	}
	return nil
}

// checkSpecUses refuses a create whose snapshot or layers p may not see.
func (s *Server) checkSpecUses(ctx context.Context, p *iam.Principal, spec *api.CreateSandboxRequest) error {
	if spec.Snapshot != "" {
		if _, err := s.snapshotOf(ctx, p, spec.Snapshot); err != nil {
			return err
		}
	}
	for _, a := range spec.Layers {
		if err := s.checkLayerUse(ctx, p, a.Layer); err != nil {
			return err
		}
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
