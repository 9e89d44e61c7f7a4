package e2e

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestCreateUnknownUser: a default user the image does not know is the
// client's mistake: 400 naming it, not 503.
func TestCreateUnknownUser(t *testing.T) {
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
