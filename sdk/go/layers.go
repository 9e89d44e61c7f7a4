package warren

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
)

// layerPath escapes a layer reference for the path (its slashes stay).
func layerPath(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/v1/layers/" + strings.Join(parts, "/")
}

// CreateLayerFromTar uploads a layer tarball (plain or gzip; OCI whiteouts
// honoured) as name@version (version 0: the next one). A seekable r is
// replayed on retry.
func (c *Client) CreateLayerFromTar(ctx context.Context, name string, version int, r io.Reader) (*api.Layer, error) {
	q := url.Values{"name": {name}}
	if version != 0 {
		q.Set("version", strconv.Itoa(version))
	}
	var l api.Layer
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/layers", query: q, body: r, ctype: "application/x-tar", retry: true}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// CreateLayerFromSandbox packs the writable layer of sandbox id (its changes
// to the root) as name@version (version 0: the next one).
func (c *Client) CreateLayerFromSandbox(ctx context.Context, id, name string, version int) (*api.Layer, error) {
	var l api.Layer
	req := api.CreateLayerRequest{Name: name, Version: version, FromSandbox: id}
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/layers", json: &req}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Layers lists every version of every named layer, or of name only.
func (c *Client) Layers(ctx context.Context, name string) ([]api.Layer, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	var l api.LayerList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/layers", query: q, retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Layers, nil
}

// Layer inspects a layer: "name" (the latest version) or "name@version".
func (c *Client) Layer(ctx context.Context, ref string) (*api.Layer, error) {
	var l api.Layer
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: layerPath(ref), retry: true}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// DeleteLayer removes "name@version", or every version of "name", and
// returns what it removed. Sandboxes using the layer keep it until they stop.
func (c *Client) DeleteLayer(ctx context.Context, ref string) ([]api.Layer, error) {
	var l api.LayerList
	if _, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: layerPath(ref)}, &l); err != nil {
		return nil, err
	}
	return l.Layers, nil
}

// GCLayers removes layers that no image, named layer or sandbox uses.
func (c *Client) GCLayers(ctx context.Context) (*api.GCResult, error) {
	var r api.GCResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/layers:gc"}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// PullImage pulls ref from its OCI registry and stores it as name (ref when
// empty).
func (c *Client) PullImage(ctx context.Context, ref, name string) (*api.Image, error) {
	var img api.Image
	req := api.PullImageRequest{Ref: ref, Name: name}
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/images", json: &req, retry: true}, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// CommitImage stores an image made of a base image and named layers
// stacked above it, with config's settings over the base's (the last step
// of an image build).
func (c *Client) CommitImage(ctx context.Context, req api.CommitImageRequest) (*api.Image, error) {
	var img api.Image
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/images:commit", json: &req, retry: true}, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// ImportImage uploads an image archive (OCI archive, docker-save archive or
// a root filesystem tarball, plain or gzip) and stores it as name. A
// seekable r is replayed on retry.
func (c *Client) ImportImage(ctx context.Context, name string, r io.Reader) (*api.Image, error) {
	var img api.Image
	q := url.Values{"name": {name}}
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/images:import", query: q, body: r, ctype: "application/x-tar", retry: true}, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// ImportDisk uploads a VM disk image (format "qcow2" or "raw") and stores
// it as name, an image that sandboxes of tier "vm" boot with its own
// bootloader, kernel and init. The server validates it (a corrupt image, a
// backing file or an external data file is a 400). A seekable r is
// replayed on retry.
func (c *Client) ImportDisk(ctx context.Context, name, format string, r io.Reader) (*api.Image, error) {
	var img api.Image
	q := url.Values{"name": {name}, "disk": {format}}
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/images:import", query: q, body: r, ctype: "application/octet-stream", retry: true}, &img); err != nil {
		return nil, err
	}
	return &img, nil
}
