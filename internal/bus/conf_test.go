package bus

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
)

// TestDeployConfMatchesPermissions: deploy/systemd/nats.conf, for the
// official nats-server, gives the roles the permissions the embedded
// server gives them.
func TestDeployConfMatchesPermissions(t *testing.T) {
	m, err := conf.ParseFile("../../deploy/systemd/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	strs := func(v any) []string {
		var out []string
		switch x := v.(type) {
		case string:
			out = []string{x}
		case []any:
			for _, e := range x {
				out = append(out, fmt.Sprint(e))
			}
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	users := m["authorization"].(map[string]any)["users"].([]any)
	api := users[0].(map[string]any)["permissions"].(map[string]any)
	want := apiserverPermissions()
	pub, sub := api["publish"].(map[string]any), api["subscribe"].(map[string]any)
	if !slices.Equal(strs(pub["allow"]), sorted(want.Publish.Allow)) || !slices.Equal(strs(pub["deny"]), sorted(want.Publish.Deny)) ||
		!slices.Equal(strs(sub["allow"]), sorted(want.Subscribe.Allow)) || !slices.Equal(strs(sub["deny"]), sorted(want.Subscribe.Deny)) {
		t.Errorf("apiserver: nats.conf has %v, the code %+v %+v", api, want.Publish, want.Subscribe)
	}
	edge := users[1].(map[string]any)["permissions"].(map[string]any)
	want = edgePermissions("node-1")
	pub = edge["publish"].(map[string]any)
	if !slices.Equal(strs(pub["allow"]), sorted(want.Publish.Allow)) || !slices.Equal(strs(pub["deny"]), sorted(want.Publish.Deny)) {
		t.Errorf("edge publish: nats.conf has %v, the code %+v", pub, want.Publish)
	}
	if got := strs(edge["subscribe"]); !slices.Equal(got, sorted(want.Subscribe.Allow)) {
		t.Errorf("edge subscribe: nats.conf has %v, the code %v", got, want.Subscribe.Allow)
	}
}
