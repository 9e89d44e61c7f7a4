package apiserver

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// validImageName checks an image name for the API.
func validImageName(name string) error {
	if name == "" {
		return invalid("name is required")
	}
	if err := api.ValidImageName(name); err != nil {
		return invalid("%s", strings.TrimPrefix(err.Error(), "image: "))
	}
	return nil
}

// rootOnlyImages refuses a token below the root project: image names are
// one catalog shared by every project (as for pulls), so a tenant must not
// replace what another project's sandboxes start from.
func rootOnlyImages(r *http.Request, what string) error {
	if p := principal(r); p.Project != "" {
		return &api.Error{Code: api.CodeForbidden, Message: what + " into the shared image catalog needs a root token"}
	}
	return nil
}

// commitImage stores an image made of a base image and named layers (the
// last step of `warren image build`).
func (s *Server) commitImage(w http.ResponseWriter, r *http.Request) error {
	var req api.CommitImageRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := validImageName(req.Name); err != nil {
		return err
	}
	if req.Base != "" && req.Base != "scratch" {
		if err := api.ValidImageName(req.Base); err != nil {
			return invalid("base: %s", strings.TrimPrefix(err.Error(), "image: "))
		}
	}
	if len(req.Layers) > 128 {
		return invalid("at most 128 layers")
	}
	for _, ref := range req.Layers {
		if _, _, err := layerRef(ref); err != nil {
			return err
		}
	}
	if c := req.Config; c != nil {
		for _, kv := range c.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
				return invalid("config.env entry %q must be KEY=VALUE", truncate(kv))
			}
		}
		if c.WorkingDir != "" && !strings.HasPrefix(c.WorkingDir, "/") {
			return invalid("config.working_dir %q must be an absolute path", truncate(c.WorkingDir))
		}
	}
	if err := rootOnlyImages(r, "committing an image"); err != nil {
		return err
	}
	for i, ref := range req.Layers {
		stored, _, err := s.resolveLayerRef(r.Context(), principal(r), "", ref)
		if err != nil {
			return err
		}
		req.Layers[i] = stored
	}
	var img api.Image
	if err := s.callStore(r.Context(), edgeproto.OpImageCommit, &req, &img); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &img)
	return nil
}

// importImage stores the request body (an OCI image archive, a docker-save
// archive or a root filesystem tarball, plain or gzip) as the image ?name=.
// The body goes to one node in 1 MiB messages and is imported there into
// the store (shared by every node of a cluster).
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) error {
	name := r.URL.Query().Get("name")
	if err := validImageName(name); err != nil {
		return err
	}
	if err := rootOnlyImages(r, "importing an image"); err != nil {
		return err
	}
	// disk=qcow2|raw: a VM disk image for the vm tier (validated on the node).
	disk := r.URL.Query().Get("disk")
	if disk != "" && disk != "qcow2" && disk != "raw" {
		return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("disk must be qcow2 or raw, not %q", truncate(disk))}
	}
	if r.ContentLength > MaxLayerUpload {
		return &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("image archive exceeds %d bytes", int64(MaxLayerUpload))}
	}
	var img api.Image
	if err := s.uploadToStore(w, r, edgeproto.LayerRequest{Image: name, Disk: disk}, &img); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &img)
	return nil
}
