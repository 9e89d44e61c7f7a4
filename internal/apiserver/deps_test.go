package apiserver

import (
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
)

// The ingress links only wire packages, never the node's code: an
// apiserver binary that pulled in the runtime, the agent, scratch, the
// image store or the registry client would carry (and could call) what
// only an edge may run. internal/edgeproto holds what both sides share.
var forbiddenDeps = []string{
	"github.com/warrenhq/warren/internal/edge",
	"github.com/warrenhq/warren/internal/runtime",
	"github.com/warrenhq/warren/internal/agent",
	"github.com/warrenhq/warren/internal/scratch",
	"github.com/warrenhq/warren/internal/image",
	"github.com/warrenhq/warren/internal/imagebuild",
	"github.com/google/go-containerregistry",
}

// forbidden reports whether dep is one of forbiddenDeps or below one
// (internal/runtime/container, ...); internal/edgeproto and
// internal/agentproto are other packages, not below.
func forbidden(dep string) bool {
	for _, f := range forbiddenDeps {
		if dep == f || strings.HasPrefix(dep, f+"/") {
			return true
		}
	}
	return false
}

func TestIngressDepsNoNodeCode(t *testing.T) {
	goBin := filepath.Join(goruntime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("no go command to list dependencies with: %v", err)
		}
	}
	for _, pkg := range []string{"github.com/warrenhq/warren/internal/apiserver", "github.com/warrenhq/warren/internal/e2b"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		var bad []string
		for _, dep := range strings.Fields(string(out)) {
			if forbidden(dep) {
				bad = append(bad, dep)
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s links the node's code: %s", pkg, strings.Join(bad, ", "))
		}
	}
}
