package sandboxspec

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestNormalizeNetwork(t *testing.T) {
	req := api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{Egress: []string{"10.1.2.9/24:443/tcp", "10.9.9.9"}}}
	if err := Normalize(&req); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(req.Network.Egress, ","); got != "10.1.2.0/24:443/tcp,10.9.9.9/32" {
		t.Errorf("canonical egress %q", got)
	}
	req = api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{}}
	if err := Normalize(&req); err != nil || req.Network.Egress == nil {
		t.Errorf("empty network: %v %#v", err, req.Network)
	}
	req = api.CreateSandboxRequest{Image: "busybox"}
	if err := Normalize(&req); err != nil || req.Network != nil {
		t.Errorf("no network: %v %#v", err, req.Network)
	}
	many := make([]string, 100000)
	for i := range many {
		many[i] = "10.0.0.1"
	}
	for _, bad := range [][]string{{"10.1.2.0/33"}, {"10.1.2.3:0"}, {"10.1.2.3:70000"}, {"::1"}, {"Pypi"}, {"-x.com"}, {"a..b"}, {"*.*.x.com"}, {strings.Repeat("1", 100000)}, many} {
		req := api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{Egress: bad}}
		err := Normalize(&req)
		if err == nil || err.Code != api.CodeInvalid || len(err.Message) > 200 {
			t.Errorf("egress %.40q: %v", bad, err)
		}
	}
}

func TestNetworkGroupName(t *testing.T) {
	for _, ok := range []string{"", "g", "job-17", strings.Repeat("a", 63)} {
		req := api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{Group: ok}}
		if err := Normalize(&req); err != nil || req.Network.Group != ok {
			t.Errorf("group %q: %v", ok, err)
		}
	}
	for _, bad := range []string{"G", "a_b", "a b", "a.b", strings.Repeat("a", 64), strings.Repeat("x", 100000)} {
		req := api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{Group: bad}}
		err := Normalize(&req)
		if err == nil || err.Code != api.CodeInvalid || !strings.Contains(err.Message, "network.group") || len(err.Message) > 200 {
			t.Errorf("group %.40q: %v", bad, err)
		}
	}
	for _, bad := range []int{-1, api.MaxEgressRateMbit + 1} {
		req := api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{EgressRateMbit: bad}}
		if err := Normalize(&req); err == nil || err.Code != api.CodeInvalid || !strings.Contains(err.Message, "egress_rate_mbit") {
			t.Errorf("egress_rate_mbit %d: %v", bad, err)
		}
	}
	var n api.NetworkSpec
	if err := json.Unmarshal([]byte(`{"egress":"internet","group":"g","egress_rate_mbit":8}`), &n); err != nil || n.Group != "g" || len(n.Egress) != 1 || n.EgressRateMbit != 8 {
		t.Errorf("decoded %+v %v", n, err)
	}
}
