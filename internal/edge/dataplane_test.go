package edge

import (
	"context"
	"testing"

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
