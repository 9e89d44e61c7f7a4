package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestCreateUnknownUser: a default user the image does not know is the
// client's mistake: 400 naming it, not 503.
func TestCreateUnknownUser(t *testing.T) {
	parallel(t)
	s := startServer(t)
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", s.Token, []byte(`{"image":"busybox","user":"nosuch"}`), nil)
	if code != 400 || !strings.Contains(body, "nosuch") {
		t.Fatalf("create with user nosuch: %d %s", code, body)
	}
	// The node is not left holding anything of it.
	sb := s.create(t, api.CreateSandboxRequest{User: "nobody"})
	if r := s.sh(t, sb.ID, "id -un"); strings.TrimSpace(r.Stdout) != "nobody" {
		t.Fatalf("user nobody: %+v", r)
	}
}

// TestNoHostPathsInside: the mount table and PID 1's command line inside
// a sandbox name no path of the node.
func TestNoHostPathsInside(t *testing.T) {
	parallel(t)
	s := startServer(t)
	if _, err := s.C.CreateLayerFromTar(context.Background(), "tk/paths", 0, bytes.NewReader(tarOf(t, [2]string{"bin/tool", "x"}))); err != nil {
		t.Fatal(err)
	}
	sb := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "tk/paths", Mount: "/opt/tk", Protected: true}}})
	r := s.sh(t, sb.ID, "cat /proc/1/cmdline; echo; cat /proc/self/mountinfo")
	if strings.Contains(r.Stdout, s.dataDir) || !strings.HasPrefix(r.Stdout, "warren-agent") {
		t.Fatalf("host paths inside:\n%s", r.Stdout)
	}
	t.Logf("%s", r.Stdout)
}
