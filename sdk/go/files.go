package warren

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"

	"github.com/warrenhq/warren/api"
)

func filesPath(id string) string { return "/v1/sandboxes/" + esc(id) + "/files" }

// WriteFile creates or replaces the file at path inside the sandbox with the
// contents of r. mode is the permission bits (0 lets the server choose,
// 0644). Parent directories must exist (see Mkdir). A body that implements
// io.Seeker (bytes.Reader, strings.Reader, *os.File) is retried on 429/503;
// any other reader is sent once.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (*api.FileInfo, error) {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", uint32(mode.Perm())))
	}
	if r == nil {
		r = bytes.NewReader(nil)
	}
	var fi api.FileInfo
	if _, err := c.doJSON(ctx, &request{method: http.MethodPut, path: filesPath(id), query: q, body: r, ctype: "application/octet-stream", retry: true}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// WriteFileBytes is WriteFile with the contents in memory.
func (c *Client) WriteFileBytes(ctx context.Context, id, path string, data []byte, mode fs.FileMode) (*api.FileInfo, error) {
	return c.WriteFile(ctx, id, path, bytes.NewReader(data), mode)
}

// ReadFile opens the file at path inside the sandbox. The caller closes it.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, &request{method: http.MethodGet, path: filesPath(id), query: url.Values{"path": {path}}, accept: "application/octet-stream", retry: true})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadFileBytes reads a whole file into memory.
func (c *Client) ReadFileBytes(ctx context.Context, id, path string) ([]byte, error) {
	rc, err := c.ReadFile(ctx, id, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("warren: read %s: %w", path, err)
	}
	return b, nil
}

// ListFiles lists the entries of the directory at path.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	var l api.FileList
	q := url.Values{"path": {path}, "list": {"1"}}
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: filesPath(id), query: q, retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Files, nil
}

// Stat describes the file at path (symlinks are not followed).
func (c *Client) Stat(ctx context.Context, id, path string) (*api.FileInfo, error) {
	var fi api.FileInfo
	q := url.Values{"path": {path}, "stat": {"1"}}
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: filesPath(id), query: q, retry: true}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Remove deletes the file or empty directory at path; with recursive set, a
// directory and everything below it.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	_, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: filesPath(id), query: q, retry: true}, nil)
	return err
}

// Mkdir creates a directory (with parents, like mkdir -p, when req.Parents).
func (c *Client) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (*api.FileInfo, error) {
	var fi api.FileInfo
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: filesPath(id) + "/mkdir", json: req, retry: req.Parents}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Rename moves a file or directory inside the sandbox.
func (c *Client) Rename(ctx context.Context, id, from, to string) error {
	_, err := c.doJSON(ctx, &request{method: http.MethodPost, path: filesPath(id) + "/rename", json: api.RenameRequest{From: from, To: to}}, nil)
	return err
}

// UploadArchive extracts the tar stream r into the directory dir inside the
// sandbox and returns how many files it wrote.
func (c *Client) UploadArchive(ctx context.Context, id, dir string, r io.Reader) (int, error) {
	var out struct {
		Files int `json:"files"`
	}
	q := url.Values{"path": {dir}}
	if _, err := c.doJSON(ctx, &request{method: http.MethodPut, path: "/v1/sandboxes/" + esc(id) + "/archive", query: q, body: r, ctype: "application/x-tar", retry: true}, &out); err != nil {
		return 0, err
	}
	return out.Files, nil
}

// DownloadArchive returns the directory dir of the sandbox as a tar stream
// whose entry names are relative to dir. The caller closes it.
func (c *Client) DownloadArchive(ctx context.Context, id, dir string) (io.ReadCloser, error) {
	q := url.Values{"path": {dir}}
	resp, err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/archive", query: q, accept: "application/x-tar", retry: true})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Images lists the images of the image store.
func (c *Client) Images(ctx context.Context) ([]api.Image, error) {
	var l api.ImageList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/images", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Images, nil
}

// Nodes lists the nodes of the cluster as the watcher sees them.
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var l api.NodeList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/nodes", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Nodes, nil
}

// Health checks GET /healthz (no token needed).
func (c *Client) Health(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/healthz", noAuth: true, retry: true}, &out); err != nil {
		return err
	}
	if out.Status != "ok" {
		return fmt.Errorf("warren: healthz: status %q", out.Status)
	}
	return nil
}
