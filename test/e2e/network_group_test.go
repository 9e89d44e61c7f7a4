package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestNetworkGroup: sandboxes created with the same network.group (of one
// project) reach each other on any port, both ways; a sandbox of no group,
// and one of another project's group of the same name, reach neither and
// are reached by neither; a bad name is the client's error; deleting a
// member takes its address out of the group's set, and the last member the
// set itself.
func TestNetworkGroup(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 60+os.Getpid()%60)
	s := startServer(t, "--net-pool", pool)
	ctx := context.Background()

	for _, bad := range []string{"Upper", "a_b", strings.Repeat("x", 64), "a b"} {
		b, _ := json.Marshal(map[string]any{"image": "busybox", "network": map[string]any{"egress": []string{}, "group": bad}})
		code, body := s.rawRequest(t, "POST", "/v1/sandboxes", "", b, map[string]string{"Content-Type": "application/json"})
		if code != 422 || !strings.Contains(body, "network.group") {
			t.Errorf("group %q: %d %s, want 422 naming network.group", bad, code, body)
		}
	}

	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "netgroup-other"}); err != nil {
		t.Fatal(err)
	}
	tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "u-netgroup-other", Project: "netgroup-other", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	other := warren.New(s.URL, tk.Secret)

	grouped := func() *api.NetworkSpec { return &api.NetworkSpec{Egress: []string{}, Group: "g"} }
	a := s.create(t, api.CreateSandboxRequest{Network: grouped()})
	b := s.create(t, api.CreateSandboxRequest{Network: grouped()})
	lone := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{}}})
	foreign, err := other.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: grouped()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = other.Delete(context.Background(), foreign.ID) })
	if a.Network == nil || a.Network.Group != "g" {
		t.Errorf("created sandbox's network: %+v", a.Network)
	}
	addr := map[string]string{}
	for _, sb := range []*api.Sandbox{a, b, lone} {
		n, err := s.C.Network(ctx, sb.ID)
		if err != nil || n.Address == "" {
			t.Fatalf("network of %s: %+v %v", sb.ID, n, err)
		}
		addr[sb.ID] = n.Address
	}
	fn, err := other.Network(ctx, foreign.ID)
	if err != nil || fn.Address == "" {
		t.Fatalf("network of the other project's sandbox: %+v %v", fn, err)
	}
	addr[foreign.ID] = fn.Address

	// Every sandbox serves "hi <id>" on 7000 and 7001.
	serve := func(c *warren.Client, id string) {
		for _, cmd := range []string{
			"while true; do echo hi " + id + " | nc -l -p 7000; done",
			"while true; do echo hi " + id + " | nc -l -p 7001; done",
		} {
			if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: cmd, Background: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sb := range []*api.Sandbox{a, b, lone} {
		serve(s.C, sb.ID)
	}
	serve(other, foreign.ID)
	time.Sleep(300 * time.Millisecond)
	reach := func(c *warren.Client, from, to, port string) bool {
		t.Helper()
		r, err := c.Exec(ctx, from, api.ExecRequest{Cmd: "nc -w 3 " + addr[to] + " " + port + " </dev/null"})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(r.Stdout, "hi "+to)
	}
	for _, p := range []string{"7000", "7001"} {
		if !reach(s.C, a.ID, b.ID, p) || !reach(s.C, b.ID, a.ID, p) {
			t.Errorf("members of group g do not reach each other on %s", p)
		}
	}
	// Another protocol: ICMP echo, between members only.
	if r := s.sh(t, a.ID, "ping -c 1 -W 3 "+addr[b.ID]); r.ExitCode != 0 {
		t.Errorf("ping between members: exit %d %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	if r := s.sh(t, a.ID, "ping -c 1 -W 3 "+addr[lone.ID]); r.ExitCode == 0 {
		t.Errorf("a member pings a sandbox of no group: %q", r.Stdout)
	}
	for _, m := range []*api.Sandbox{a, b} {
		if reach(s.C, m.ID, lone.ID, "7000") || reach(s.C, lone.ID, m.ID, "7000") {
			t.Errorf("a member and a sandbox of no group reach each other (%s, %s)", m.ID, lone.ID)
		}
		if reach(s.C, m.ID, foreign.ID, "7000") || reach(other, foreign.ID, m.ID, "7000") {
			t.Errorf("groups of the same name in two projects reach each other (%s, %s)", m.ID, foreign.ID)
		}
	}
	// A change of the list keeps the group.
	if _, err := s.C.SetNetwork(ctx, a.ID, []string{nettest.Mirror + ":443/tcp"}); err != nil {
		t.Fatal(err)
	}
	if !reach(s.C, a.ID, b.ID, "7000") {
		t.Errorf("members lost each other after a change of the list")
	}
	if got, _ := s.C.Get(ctx, a.ID); got == nil || got.Network == nil || got.Network.Group != "g" {
		t.Errorf("sandbox view after the change: %+v", got)
	}
	if n, _ := s.C.Network(ctx, lone.ID); n == nil || n.DeniedBy["sandbox"] == 0 {
		t.Errorf("the lone sandbox's attempts were not counted as sandbox refusals: %+v", n)
	}

	// Deleting a member takes it out of its group's set; the last member
	// takes the set.
	groupSets := func() []string {
		var out []string
		for _, l := range netLeaks(s.dataDir) {
			if strings.Contains(l, "set g_") {
				out = append(out, l)
			}
		}
		return out
	}
	if len(groupSets()) != 2 {
		t.Errorf("group sets: %v, want two (one per project)", groupSets())
	}
	if _, err := s.C.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if n := groupMembers(t, s, addr[b.ID]); n != 0 {
		t.Errorf("a deleted member's address is still in a group set")
	}
	for _, sb := range []*api.Sandbox{a, lone} {
		if _, err := s.C.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Delete(ctx, foreign.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l := netLeaks(s.dataDir); !onlyParked(l); l = netLeaks(s.dataDir) {
		if time.Now().After(deadline) {
			t.Fatalf("deleted grouped sandboxes left: %v", l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// groupMembers counts the group sets of s's edge that hold addr.
func groupMembers(t *testing.T, s *server, addr string) int {
	t.Helper()
	n := 0
	for _, l := range netLeaks(s.dataDir) {
		if strings.Contains(l, "set g_") && strings.Contains(l, " "+addr+" ") {
			n++
		}
	}
	return n
}
