package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// uploadIdle is how long an upload may wait for its next chunk.
const uploadIdle = 2 * time.Minute

type upload struct {
	f     *os.File
	n     int64
	name  string
	ver   int
	image string // an image archive to import as this name
	disk  string // with image: the upload is a VM disk image of this format
	last  time.Time
	inUse bool
}

type uploads struct {
	mu sync.Mutex
	m  map[string]*upload
}

func invalidf(format string, a ...any) error {
	return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(format, a...)}
}

func (e *Edge) layerOp(ctx context.Context, op string, req *LayerRequest) (any, error) {
	switch op {
	case OpLayerList:
		ls, err := e.cfg.Images.ListLayers(ctx, req.Name)
		if err != nil {
			return nil, err
		}
		if ls == nil {
			ls = []api.Layer{}
		}
		return &api.LayerList{Layers: ls}, nil
	case OpLayerGet:
		return e.cfg.Images.ResolveLayer(ctx, req.Ref)
	case OpLayerDelete:
		gone, err := e.cfg.Images.DeleteLayer(ctx, req.Name, req.Version)
		if err != nil {
			return nil, err
		}
		return &api.LayerList{Layers: gone}, nil
	case OpLayerGC:
		return e.cfg.Images.GC(ctx)
	case OpLayerUpload:
		return e.upload(ctx, req)
	case OpLayerCreate:
		return e.packSandbox(ctx, req)
	}
	return nil, badRequest("unknown layer operation %q", op)
}

// resolveLayer finds the layer that ref names in the store. Layer names
// are per project (image.QualifiedLayerName); the apiserver resolves a
// client's plain name to its project's, an ancestor's or the shared
// catalog's (owner.go) and sends the qualified name ("~p/name", also what
// a sandbox's spec pins), and a scoped create may name only layers its
// scope sees (checkLayerScope). A plain name is the root project's shared
// catalog, or a snapshot's snap/<id>.
func (e *Edge) resolveLayer(ctx context.Context, ref string) (*api.Layer, error) {
	l, err := e.cfg.Images.ResolveLayer(ctx, ref)
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", truncateName(ref))}
	}
	return l, err
}

// checkLayerScope refuses (404, as a name nobody has) a scoped create that
// names a project's layer its scope does not see: the project's own, an
// ancestor's (layers are catalogs for the projects below) or a
// descendant's; the edge's own check behind the apiserver's.
func checkLayerScope(spec *api.CreateSandboxRequest, scope string) error {
	for _, a := range spec.Layers {
		name, _, _ := strings.Cut(a.Layer, "@")
		owner, _ := image.SplitLayerName(name)
		if owner != "" && !sandboxspec.Within(scope, owner) && !sandboxspec.Within(owner, scope) {
			return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", truncateName(a.Layer))}
		}
	}
	return nil
}

// upload appends a chunk of a layer tarball to a staging file beside the
// store; the final chunk turns it into the layer.
func (e *Edge) upload(ctx context.Context, req *LayerRequest) (any, error) {
	e.uploads.mu.Lock()
	if e.uploads.m == nil {
		e.uploads.m = map[string]*upload{}
	}
	// Drop uploads whose client went away.
	for h, u := range e.uploads.m {
		if !u.inUse && time.Since(u.last) > uploadIdle {
			u.f.Close()
			os.Remove(u.f.Name())
			delete(e.uploads.m, h)
		}
	}
	var u *upload
	handle := req.Handle
	if handle == "" {
		f, err := e.cfg.Images.StageFile()
		if err != nil {
			e.uploads.mu.Unlock()
			return nil, fmt.Errorf("stage upload: %w", err)
		}
		var b [12]byte
		_, _ = rand.Read(b[:])
		handle = hex.EncodeToString(b[:])
		u = &upload{f: f, name: req.Name, ver: req.Version, image: req.Image, disk: req.Disk}
		e.uploads.m[handle] = u
	} else if u = e.uploads.m[handle]; u == nil || u.inUse {
		e.uploads.mu.Unlock()
		return nil, badRequest("unknown or busy upload handle")
	}
	u.inUse = true
	u.last = time.Now()
	e.uploads.mu.Unlock()

	finish := func() {
		e.uploads.mu.Lock()
		delete(e.uploads.m, handle)
		e.uploads.mu.Unlock()
		u.f.Close()
		os.Remove(u.f.Name())
	}
	if req.Abort {
		finish()
		return &UploadResult{Handle: handle}, nil
	}
	if u.n+int64(len(req.Data)) > MaxLayerUpload {
		finish()
		return nil, &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("layer upload exceeds %d bytes", int64(MaxLayerUpload))}
	}
	if _, err := u.f.Write(req.Data); err != nil {
		finish()
		return nil, fmt.Errorf("stage upload: %w", err)
	}
	u.n += int64(len(req.Data))
	if !req.Final {
		e.uploads.mu.Lock()
		u.inUse = false
		u.last = time.Now()
		e.uploads.mu.Unlock()
		return &UploadResult{Handle: handle, Bytes: u.n}, nil
	}
	defer finish()
	return e.storeUpload(ctx, u.f.Name(), u.n, &LayerRequest{Name: u.name, Version: u.ver, Image: u.image, Disk: u.disk})
}

// storeUpload makes what req names of the uploaded file at path (n bytes):
// a VM disk image, an image archive or a layer.
func (e *Edge) storeUpload(ctx context.Context, path string, n int64, req *LayerRequest) (any, error) {
	if n == 0 {
		return nil, badRequest("the uploaded archive is empty")
	}
	if req.Image != "" && req.Disk != "" {
		return e.cfg.Images.ImportDisk(ctx, path, req.Image, req.Disk)
	}
	if req.Image != "" {
		return e.cfg.Images.ImportImage(ctx, path, req.Image)
	}
	return e.cfg.Images.CreateLayerFromTar(ctx, req.Name, req.Version, path)
}

// uploadToStore is an upload to the store over the data plane: the whole
// file in one stream (with its flow control, instead of base64 chunks on
// the bus), staged beside the store, then made into what the request names.
// A broken stream (the client went away, its body was too large) or a
// failure leaves no staged file. The grant names no sandbox: the apiserver
// checked the caller's right to the name, as for the bus's upload.
func (e *Edge) uploadToStore(ctx context.Context, g *dataplane.Grant, body []byte, in io.Reader) (any, error) {
	if g.Sandbox != "" || g.Scoped {
		return nil, &api.Error{Code: api.CodeForbidden, Message: "a store upload's grant names no sandbox and no scope"}
	}
	var req LayerRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if req.Handle != "" || len(req.Data) > 0 || req.Final || req.Abort {
		return nil, badRequest("a store upload over the data plane is one stream: no handle, data, final or abort")
	}
	f, err := e.cfg.Images.StageFile()
	if err != nil {
		return nil, fmt.Errorf("stage upload: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(in, MaxLayerUpload+1))
	if err != nil {
		return nil, fmt.Errorf("%w: layer upload: %w", dataplane.ErrBroken, err)
	}
	if n > MaxLayerUpload {
		return nil, &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("layer upload exceeds %d bytes", int64(MaxLayerUpload))}
	}
	return e.storeUpload(ctx, f.Name(), n, &req)
}

// packSandbox stores the writable layer of a sandbox as a named layer.
func (e *Edge) packSandbox(ctx context.Context, req *LayerRequest) (any, error) {
	sb, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	sb.mu.Lock()
	upper := sb.rec.Upper
	ids := append([]string(nil), sb.rec.Layers[:len(sb.rec.Layers)-len(sb.rec.Binds)]...)
	var idBase uint32
	if sb.rec.Handle != nil {
		idBase = sb.rec.Handle.IDBase
	}
	sb.mu.Unlock()
	if upper == "" {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s has no writable layer to pack", req.ID)}
	}
	holder := req.ID + "/pack"
	lowers, err := e.cfg.Images.MountLayers(holder, ids)
	if err != nil {
		return nil, err
	}
	defer e.cfg.Images.ReleaseLayers(holder)
	return e.cfg.Images.CreateLayerFromChanges(ctx, req.Name, req.Version, filepath.Clean(upper), lowers, idBase, "sandbox "+req.ID)
}
