package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkPauseKeepsRules: pausing a networked sandbox keeps its
// network as it was: after the resume its list still allows what it
// allowed and refuses the rest, its address and list are unchanged, and
// its refusal count carries on from before the pause.
func TestNetworkPauseKeepsRules(t *testing.T) {
	nettest.FakeInternet(t)
	s := startServer(t, "--net-pool", fmt.Sprintf("10.213.%d.0/24", 20+(os.Getpid()+53)%100))
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{nettest.Mirror + ":443/tcp"}}})
	reach := func(port string) bool {
		t.Helper()
		r := s.sh(t, sb.ID, "nc -w 3 "+nettest.Mirror+" "+port+" </dev/null")
		return r.ExitCode == 0 && r.Stdout == "hello"
	}
	if !reach("443") || reach("80") {
		t.Fatalf("before the pause: 443 %v, 80 %v (want true, false)", reach("443"), reach("80"))
	}
	before, err := s.C.Network(ctx, sb.ID)
	if err != nil || before.Denied == 0 {
		t.Fatalf("network before the pause: %+v %v", before, err)
	}
	p, err := s.C.Pause(ctx, sb.ID)
	if err != nil || p.State != api.StatePaused {
		t.Fatalf("pause: %+v %v", p, err)
	}
	paused, err := s.C.Network(ctx, sb.ID)
	if err != nil || paused.Address != before.Address || fmt.Sprint(paused.Egress) != fmt.Sprint(before.Egress) {
		t.Errorf("network while paused: %+v %v, was %+v", paused, err, before)
	}
	if r, err := s.C.Resume(ctx, sb.ID); err != nil || r.State != api.StateRunning {
		t.Fatalf("resume: %+v %v", r, err)
	}
	if !reach("443") {
		t.Error("after the resume: the listed destination is refused")
	}
	if reach("80") {
		t.Error("after the resume: a destination outside the list is reachable")
	}
	after, err := s.C.Network(ctx, sb.ID)
	if err != nil || after.Address != before.Address || fmt.Sprint(after.Egress) != fmt.Sprint(before.Egress) || after.Denied <= before.Denied {
		t.Errorf("network after the resume: %+v %v, before the pause %+v (same address and list, more refusals)", after, err, before)
	}
}
