package apiserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// MaxLayerUpload bounds one uploaded layer tarball.
const MaxLayerUpload = edgeproto.MaxLayerUpload

// anyNode picks an up node for store operations that belong to no sandbox
// (the store is shared by every node of a cluster).
func (s *Server) anyNode() (string, error) {
	up := s.cfg.Watcher.Up()
	if len(up) == 0 {
		return "", &api.Error{Code: api.CodeUnavailable, Message: "no node is up"}
	}
	return up[rand.IntN(len(up))].Name, nil
}

// callStore sends a store operation (layers, snapshots' layers) that the
// caller's ownership was already checked for (owner.go) to any node, on
// the apiserver's own behalf: the edge's scope check is about sandboxes.
func (s *Server) callStore(ctx context.Context, op string, req, out any) error {
	node, err := s.anyNode()
	if err != nil {
		return err
	}
	return s.callStoreOn(ctx, node, op, req, out)
}

func (s *Server) callStoreOn(ctx context.Context, node, op string, req, out any) error {
	err := s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), op, req, out, nil)
	if errors.Is(err, bus.ErrNoResponders) {
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s is not available", node)}
	}
	return err
}

func invalid(format string, a ...any) error {
	return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(format, a...)}
}

// layerRef checks a path's layer reference ("name" or "name@version").
func layerRef(ref string) (string, int, error) {
	name, v, err := api.ParseLayerRef(ref)
	if err != nil {
		return "", 0, invalid("%s", strings.TrimPrefix(err.Error(), "invalid: "))
	}
	return name, v, nil
}

func parseVersion(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > api.MaxLayerVersion {
		return 0, invalid("version %q must be a positive integer", truncate(v))
	}
	return n, nil
}

// createLayer: a JSON body packs a sandbox's changes; any other body is a
// layer tarball (plain or gzip) named by ?name= and ?version=.
func (s *Server) createLayer(w http.ResponseWriter, r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/json") {
		var req api.CreateLayerRequest
		if err := decodeJSON(w, r, &req); err != nil {
			return err
		}
		if _, _, err := layerRef(req.Name); err != nil || strings.Contains(req.Name, "@") {
			if err == nil {
				err = invalid("name %q must not carry a version (use the version field)", truncate(req.Name))
			}
			return err
		}
		if req.Version < 0 || req.Version > api.MaxLayerVersion {
			return invalid("version must be a positive integer")
		}
		if req.FromSandbox == "" {
			return invalid("from_sandbox is required (or upload a tarball with ?name=)")
		}
		// The layer holds the sandbox's files: it is the sandbox's project's.
		var src api.Sandbox
		if err := s.callEdge(r.Context(), req.FromSandbox, edgeproto.OpGet, &edgeproto.IDRequest{ID: req.FromSandbox}, &src, nil); err != nil {
			return err
		}
		if err := s.checkStorage(r.Context(), src.Project, 1); err != nil {
			return err
		}
		stored, err := s.claimLayerName(r.Context(), principal(r), req.Name, src.Project)
		if err != nil {
			return err
		}
		latest := s.latestVersion(r.Context(), stored)
		var l api.Layer
		if err := s.callEdge(r.Context(), req.FromSandbox, edgeproto.OpLayerCreate,
			&edgeproto.LayerRequest{ID: req.FromSandbox, Name: stored, Version: req.Version}, &l, nil); err != nil {
			return err
		}
		if l.Version > latest {
			s.charge(r.Context(), src.Project, l.Size)
		}
		showLayer(principal(r), &l, src.Project)
		writeJSON(w, http.StatusCreated, &l)
		return nil
	}
	q := r.URL.Query()
	name := q.Get("name")
	if name == "" {
		return invalid("name is required (?name=ws/x)")
	}
	if err := api.ValidLayerName(name); err != nil {
		return invalid("%s", strings.TrimPrefix(err.Error(), "invalid: "))
	}
	version, err := parseVersion(q.Get("version"))
	if err != nil {
		return err
	}
	if r.ContentLength > MaxLayerUpload {
		return &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("layer exceeds %d bytes", int64(MaxLayerUpload))}
	}
	ctx := r.Context()
	p := principal(r)
	if err := s.checkStorage(ctx, p.Project, max(r.ContentLength, 1)); err != nil {
		return err
	}
	stored, err := s.claimLayerName(ctx, p, name, p.Project)
	if err != nil {
		return err
	}
	latest := s.latestVersion(ctx, stored)
	var l api.Layer
	if err := s.uploadToStore(w, r, edgeproto.LayerRequest{Name: stored, Version: version}, &l); err != nil {
		return err
	}
	if l.Version > latest {
		s.charge(ctx, p.Project, l.Size)
	}
	showLayer(p, &l, p.Project)
	writeJSON(w, http.StatusCreated, &l)
	return nil
}

// uploadToStore sends the request body to one node's store, over its data
// listener, else (a node without one) in uploadChunk messages of base (a
// layer or an image upload) on the bus, and decodes the answer into out.
// A body that fails midway (too large, cut short) aborts the upload on the
// node, so nothing half-written stays.
func (s *Server) uploadToStore(w http.ResponseWriter, r *http.Request, base edgeproto.LayerRequest, out any) error {
	node, err := s.anyNode()
	if err != nil {
		return err
	}
	ctx := r.Context()
	body := http.MaxBytesReader(w, r.Body, MaxLayerUpload)
	if addr := s.dataAddr(node, edgeproto.OpLayerUpload); addr != "" {
		// Over the data plane: the whole body as one stream, with flow
		// control; a body that breaks (too large, cut short) resets it,
		// and the node keeps nothing of it.
		// The grant names no sandbox and no scope (nil headers).
		err := s.callData(withUpload(ctx, body), addr, "", edgeproto.OpLayerUpload, &base, out, nil, nil)
		if errors.Is(err, dataplane.ErrUnreachable) {
			return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s is not available", node)}
		}
		return err
	}
	buf := make([]byte, uploadChunk)
	handle := ""
	abort := func() {
		if handle != "" {
			_ = s.callStoreOn(context.WithoutCancel(ctx), node, edgeproto.OpLayerUpload, &edgeproto.LayerRequest{Handle: handle, Abort: true}, nil)
		}
	}
	for {
		n, rerr := io.ReadFull(body, buf)
		final := rerr != nil
		if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
			abort()
			return rerr // a MaxBytesError answers 413 (writeError)
		}
		req := base
		req.Handle, req.Data, req.Final = handle, buf[:n], final
		if final {
			return s.callStoreOn(ctx, node, edgeproto.OpLayerUpload, &req, out)
		}
		var res edgeproto.UploadResult
		if err := s.callStoreOn(ctx, node, edgeproto.OpLayerUpload, &req, &res); err != nil {
			abort()
			return err
		}
		handle = res.Handle
	}
}

func (s *Server) listLayers(w http.ResponseWriter, r *http.Request) error {
	name := r.URL.Query().Get("name")
	if name != "" {
		if err := api.ValidLayerName(name); err != nil {
			return invalid("%s", strings.TrimPrefix(err.Error(), "invalid: "))
		}
	}
	ctx := r.Context()
	var all api.LayerList
	if err := s.callStore(ctx, edgeproto.OpLayerList, &edgeproto.LayerRequest{}, &all); err != nil {
		return err
	}
	p := principal(r)
	l := api.LayerList{Layers: []api.Layer{}}
	type ownerOf struct {
		owner, kind string
	}
	owners := map[string]ownerOf{}
	for _, x := range all.Layers {
		o, ok := owners[x.Name]
		if !ok {
			if project, _ := api.SplitLayerName(x.Name); project != "" {
				o = ownerOf{project, iam.KindLayer}
			} else {
				owner, snap, _, err := s.layerOwner(ctx, x.Name)
				if err != nil {
					return err
				}
				o = ownerOf{owner, layerKind(snap)}
			}
			owners[x.Name] = o
		}
		if !p.Sees(o.kind, o.owner) {
			continue
		}
		showLayer(p, &x, o.owner)
		if name == "" || x.Name == name {
			l.Layers = append(l.Layers, x)
		}
	}
	writeJSON(w, http.StatusOK, &l)
	return nil
}

// layerProject is the project whose names a layer route resolves in: the
// caller's, or ?project= (its own or one below it).
func layerProject(r *http.Request) (string, error) {
	p := principal(r)
	q := r.URL.Query().Get("project")
	if q == "" {
		return p.Project, nil
	}
	if !sandboxspec.ValidProject(q) || !p.InScope(q) {
		return "", &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("project %s is outside your project %s", truncate(q), p.Project)}
	}
	return q, nil
}

func (s *Server) getLayer(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	if _, _, err := layerRef(ref); err != nil {
		return err
	}
	project, err := layerProject(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	stored, rl, err := s.resolveLayerRef(ctx, principal(r), project, ref)
	if err != nil {
		return err
	}
	var l api.Layer
	if err := s.callStore(ctx, edgeproto.OpLayerGet, &edgeproto.LayerRequest{Ref: stored}, &l); err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
			return layerNotFound(ref)
		}
		return err
	}
	showLayer(principal(r), &l, rl.owner)
	writeJSON(w, http.StatusOK, &l)
	return nil
}

func (s *Server) deleteLayer(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	name, v, err := layerRef(ref)
	if err != nil {
		return err
	}
	if sid, ok := strings.CutPrefix(name, "snap/"); ok && sandboxspec.ValidSnapshotID(sid) {
		// A snapshot's layer goes with the snapshot, under the same rules.
		l, err := s.removeSnapshot(r.Context(), principal(r), sid)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, &api.LayerList{Layers: l})
		return nil
	}
	project, err := layerProject(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	p := principal(r)
	_, rl, err := s.resolveLayerRef(ctx, p, project, name)
	if err != nil {
		return err
	}
	// A name nobody has resolves to the shared catalog's: answer it as
	// missing, before the catalog's "only root changes it".
	if !rl.known {
		if has, err := s.storeHas(ctx, rl.stored); err != nil {
			return err
		} else if !has {
			return layerNotFound(ref)
		}
	}
	if err := ownChange(p, layerKind(rl.snap), rl.owner, layerNotFound(ref)); err != nil {
		return err
	}
	var l api.LayerList
	if err := s.callStore(ctx, edgeproto.OpLayerDelete, &edgeproto.LayerRequest{Name: rl.stored, Version: v}, &l); err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
			return layerNotFound(ref)
		}
		return err
	}
	s.forgetLayerName(context.WithoutCancel(ctx), rl)
	if rl.owner != "\x00" { // charged to its owner when made
		var freed int64
		for _, x := range l.Layers {
			freed += x.Size
		}
		s.charge(ctx, rl.owner, -freed)
	}
	if l.Layers == nil {
		l.Layers = []api.Layer{}
	}
	for i := range l.Layers {
		showLayer(p, &l.Layers[i], rl.owner)
	}
	writeJSON(w, http.StatusOK, &l)
	return nil
}

// gcLayers runs garbage collection on one node. It spares layers that node
// has mounted; on a shared store, a layer another node has mounted keeps
// working there (the mount holds the open file) and nothing can name it.
func (s *Server) gcLayers(w http.ResponseWriter, r *http.Request) error {
	if p := principal(r); p.Project != "" {
		return &api.Error{Code: api.CodeForbidden, Message: "garbage collection of the shared layer store needs a root token"}
	}
	var res api.GCResult
	if err := s.callStore(r.Context(), edgeproto.OpLayerGC, &edgeproto.LayerRequest{}, &res); err != nil {
		return err
	}
	if res.Removed == nil {
		res.Removed = []string{}
	}
	writeJSON(w, http.StatusOK, &res)
	return nil
}

func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) error {
	var req api.PullImageRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Ref == "" {
		return invalid("ref is required")
	}
	if len(req.Ref) > 512 {
		return invalid("ref is longer than 512 bytes")
	}
	if req.Name != "" {
		if err := api.ValidImageName(req.Name); err != nil {
			return invalid("%s", strings.TrimPrefix(err.Error(), "image: "))
		}
	}
	if p := principal(r); p.Project != "" {
		// Image names are one catalog shared by every project: a tenant
		// must not replace what another project's sandboxes start from.
		return &api.Error{Code: api.CodeForbidden, Message: "pulling into the shared image catalog needs a root token"}
	}
	var img api.Image
	if err := s.callStore(r.Context(), edgeproto.OpImagePull, &req, &img); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &img)
	return nil
}

// latestVersion is the highest version the store has of layer stored (0:
// none, or unknown): publishing a layer's latest content again answers
// that version, which is stored, and charged, once.
func (s *Server) latestVersion(ctx context.Context, stored string) int {
	var l api.LayerList
	if err := s.callStore(ctx, edgeproto.OpLayerList, &edgeproto.LayerRequest{Name: stored}, &l); err != nil {
		return 0
	}
	v := 0
	for _, x := range l.Layers {
		v = max(v, x.Version)
	}
	return v
}
