package snapshot

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Get reads a snapshot record (404 when unknown, 422 when id is malformed).
func (s *Snapshotter) Get(ctx context.Context, id string) (*api.Snapshot, error) {
	if !sandboxspec.ValidSnapshotID(id) {
		return nil, invalidf("snapshot %q is malformed", id)
	}
	var snap api.Snapshot
	found, _, err := s.cfg.Store.Get(ctx, id, &snap)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("snapshot %s not found", id)}
	}
	return &snap, nil
}

// Restore fills a create request's image and layers from its snapshot
// (none: nil, nil).
func (s *Snapshotter) Restore(ctx context.Context, spec *api.CreateSandboxRequest) (*api.Snapshot, error) {
	if spec.Snapshot == "" {
		return nil, nil
	}
	if spec.Image != "" || len(spec.Layers) > 0 {
		return nil, invalidf("a sandbox restored from a snapshot takes its image and layers from it")
	}
	snap, err := s.Get(ctx, spec.Snapshot)
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

// CheckScope refuses (404) a create on behalf of a project-scoped caller
// whose snapshot, or a snap/ layer, belongs to a project outside its
// scope: the edge's own check behind the apiserver's (ownership). A
// snapshot that is malformed or unknown is left to the create to refuse.
func (s *Snapshotter) CheckScope(ctx context.Context, spec *api.CreateSandboxRequest, scope string) error {
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
		snap, err := s.Get(ctx, sid)
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
