package edge

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"

	"github.com/warrenhq/warren/internal/bus"
)

// The scope is checked against the Warren-Sandbox header; a request whose
// body names another sandbox is refused, so a scoped caller cannot act on
// a sandbox outside its project by naming an allowed one in the header.
func TestSandboxHeaderMustMatchBody(t *testing.T) {
	ctx := bus.WithIncoming(context.Background(), map[string]string{bus.HeaderSandbox: "sb-n-mine"})
	for _, tc := range []struct {
		op, body string
		ok       bool
	}{
		{OpExec, `{"id":"sb-n-mine","exec":{"cmd":"true"}}`, true},
		{OpExec, `{"id":"sb-n-other","exec":{"cmd":"true"}}`, false},
		{OpFileWrite, `{"path":"/a","id":"sb-n-other","data":"eA=="}`, false},
		{OpFileRead, `{"path":"/a"}`, false},
		{OpDelete, `["sb-n-mine"]`, false},
		{OpList, `{"id":"whatever"}`, true}, // not about one sandbox
		// Every op that acts on the sandbox its body names, not only the
		// streaming and state-changing ones.
		{OpStats, `{"id":"sb-n-other"}`, false},
		{OpCommands, `{"id":"sb-n-other"}`, false},
		{OpNetwork, `{"id":"sb-n-other"}`, false},
		{OpNetworkSet, `{"id":"sb-n-other","network":{}}`, false},
		{OpSnapshot, `{"id":"sb-n-other"}`, false},
		{OpAudit, `{"id":"sb-n-other"}`, false},
		{OpTrajResume, `{"id":"sb-n-other","trajectory":"t"}`, false},
		{OpTrajAdvance, `{"id":"sb-n-other","delegate":"d"}`, false},
		{OpLayerCreate, `{"id":"sb-n-other","name":"ws/a"}`, false},
		{OpStats, `{"id":"sb-n-mine"}`, true},
		{OpLayerCreate, `{"id":"sb-n-mine","name":"ws/a"}`, true},
	} {
		err := checkSandboxHeader(ctx, tc.op, []byte(tc.body))
		if (err == nil) != tc.ok {
			t.Errorf("%s %s: %v", tc.op, tc.body, err)
		}
	}
	if err := checkSandboxHeader(context.Background(), OpExec, []byte(`{"id":"sb-n-other"}`)); err != nil {
		t.Errorf("without the header (an internal caller): %v", err)
	}
}

// handle refuses a mismatch before it looks anything up, for every op
// registered as acting on its body's sandbox.
func TestHandleRefusesHeaderBodyMismatch(t *testing.T) {
	e := &Edge{}
	ctx := bus.WithIncoming(context.Background(), map[string]string{bus.HeaderSandbox: "sb-n-mine", bus.HeaderRoot: "1"})
	n := 0
	for op, spec := range edgeOps {
		if !spec.sandboxBody {
			continue
		}
		n++
		_, err := e.handle(ctx, op, []byte(`{"id":"sb-n-other"}`), nil)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeBadRequest || !strings.Contains(ae.Message, "addressed to sandbox") {
			t.Errorf("%s: %v, want a 400 naming both sandboxes", op, err)
		}
	}
	if n < 20 {
		t.Fatalf("only %d ops act on their body's sandbox", n)
	}
}
