package edge_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/edge/edgetest"
)

// storeUpload sends in to the node's store over its data listener, as the
// apiserver's uploadToStore does, with the given grant's sandbox and scope.
func storeUpload(t *testing.T, n *edgetest.Node, addr, sandbox, scope string, req edge.LayerRequest, in io.Reader) (*api.Layer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, err := n.Conn.DataPlaneKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(req)
	var l api.Layer
	err = dataplane.NewClient(key).Do(ctx, &dataplane.Call{Addr: addr, Sandbox: sandbox, Scope: scope, Scoped: scope != "",
		Op: edge.OpLayerUpload, Body: body, Upload: in}, &l, nil)
	return &l, err
}

// staged lists the store's staged uploads.
func staged(t *testing.T, n *edgetest.Node) []string {
	t.Helper()
	f, err := n.Images.StageFile()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(f.Name()), "*"))
	return left
}

// brokenReader gives its data, then fails.
type brokenReader struct{ r io.Reader }

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, errors.New("the client went away")
	}
	return n, err
}

// TestStoreUploadOverDataPlane: a layer upload to the store is one stream
// on the data listener (not base64 chunks on the bus): the store gets the
// whole file; a stream that breaks midway makes nothing and leaves no
// staged file; a grant that names a sandbox or a scope, and a request
// with the bus's chunk fields, are refused.
func TestStoreUploadOverDataPlane(t *testing.T) {
	addr := freeAddr(t)
	n := edgetest.Start(t, func(c *edge.Config) { c.DataListen = addr })
	data := make([]byte, 9<<20+777)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)

	l, err := storeUpload(t, n, addr, "", "", edge.LayerRequest{Name: "tools", Version: 3}, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != "tools" || l.Version != 3 || l.Size != int64(len(data)) || l.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("layer %+v, want tools@3 of the %d bytes sent (sha256:%x)", l, len(data), sum)
	}
	if left := staged(t, n); len(left) > 0 {
		t.Errorf("staged files left after the upload: %v", left)
	}

	if _, err := storeUpload(t, n, addr, "", "", edge.LayerRequest{Name: "tools"}, &brokenReader{bytes.NewReader(data[:5<<20])}); err == nil {
		t.Fatal("a broken upload made a layer")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := staged(t, n)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("staged files left after a broken upload: %v", left)
		}
	}

	if _, err := storeUpload(t, n, addr, "", "", edge.LayerRequest{Name: "tools"}, bytes.NewReader(nil)); edgetest.APIError(err) == nil || edgetest.APIError(err).Code != api.CodeBadRequest {
		t.Errorf("an empty upload: %v, want a 400", err)
	}
	for _, c := range []struct {
		sandbox, scope string
		req            edge.LayerRequest
		code           string
	}{
		{"sb-n1-0000000000", "", edge.LayerRequest{Name: "tools"}, api.CodeForbidden},
		{"", "team", edge.LayerRequest{Name: "tools"}, api.CodeForbidden},
		{"", "", edge.LayerRequest{Name: "tools", Handle: "abc"}, api.CodeBadRequest},
		{"", "", edge.LayerRequest{Name: "tools", Final: true}, api.CodeBadRequest},
	} {
		_, err := storeUpload(t, n, addr, c.sandbox, c.scope, c.req, bytes.NewReader(data[:1000]))
		if ae := edgetest.APIError(err); ae == nil || ae.Code != c.code {
			t.Errorf("upload with grant (%q, %q) and %+v: %v, want %s", c.sandbox, c.scope, c.req, err, c.code)
		}
	}
}
