package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkRules: named rules are cluster objects that admins write and
// every project reads; a sandbox naming one (in egress or DSec's
// network_rules) reaches what it lists, and a change of the rule reaches
// the running sandbox within a second; "internet" opens public addresses
// only; bad input is a 4xx with a message.
func TestNetworkRules(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 20+(os.Getpid()+41)%100)
	s := startServer(t, "--net-pool", pool, "--dns-upstream", nettest.DNS)
	ctx := t.Context()
	json1 := map[string]string{"Content-Type": "application/json"}
	put := func(token, name string, v any) (int, string) {
		b, _ := json.Marshal(v)
		return s.rawRequest(t, "PUT", "/v1/network-rules/"+name, token, b, json1)
	}

	code, body := put("", "mirror", api.NetworkRule{Hosts: []string{nettest.MirrorName}, Ports: []int{443}})
	if code != 201 || !strings.Contains(body, `"version":1`) {
		t.Fatalf("put rule: %d %s", code, body)
	}
	// Bad rules, and a rule change by a project's admin.
	many := make([]string, 100000)
	for i := range many {
		many[i] = "10.0.0.1"
	}
	for _, bad := range []struct {
		name string
		rule api.NetworkRule
		want string
	}{
		{"bad-cidr", api.NetworkRule{CIDRs: []string{"10.1.2.0/33"}}, "10.1.2.0/33"},
		{"port0", api.NetworkRule{CIDRs: []string{"10.1.2.0/24"}, Ports: []int{0}}, "1-65535"},
		{"port70000", api.NetworkRule{CIDRs: []string{"10.1.2.0/24"}, Ports: []int{70000}}, "1-65535"},
		{"bad-host", api.NetworkRule{Hosts: []string{"no such host"}}, "not a DNS name"},
		{"empty", api.NetworkRule{}, "must list something"},
		{"huge", api.NetworkRule{CIDRs: many}, "exceeds"}, // 413: the body is over 1 MiB
		{"many", api.NetworkRule{CIDRs: many[:300]}, "at most"},
		{"Bad.Name", api.NetworkRule{CIDRs: []string{"10.0.0.0/8"}}, "rule name"},
	} {
		code, body := put("", bad.name, bad.rule)
		if code < 400 || code >= 500 || !strings.Contains(body, bad.want) {
			t.Errorf("rule %s: %d %.300s, want a 4xx naming %q", bad.name, code, body, bad.want)
		}
	}
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "team"}); err != nil {
		t.Fatal(err)
	}
	tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "team-admin", Project: "team", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := put(tk.Secret, "mirror", api.NetworkRule{CIDRs: []string{"0.0.0.0/0"}}); code != 403 || !strings.Contains(body, "admins only") {
		t.Errorf("a project admin changed a rule: %d %s", code, body)
	}
	code, body = s.rawRequest(t, "GET", "/v1/network-rules", tk.Secret, nil, nil)
	if code != 200 || !strings.Contains(body, `"name":"mirror"`) {
		t.Errorf("a project lists the rules: %d %s", code, body)
	}

	// Unknown rule, too many entries: the client's error.
	for _, bad := range []struct {
		body string
		code int
		want string
	}{
		{`{"image":"busybox","network":{"egress":["nosuchrule"]}}`, 400, "nosuchrule"},
		{`{"image":"busybox","network_rules":{"nosuchrule":true}}`, 400, "nosuchrule"},
		{`{"image":"busybox","network":{"egress":"everything"}}`, 400, "internet"},
		{`{"image":"busybox","network":{"egress":` + string(must(json.Marshal(many))) + `}}`, 413, "exceeds"},
		{`{"image":"busybox","network":{"egress":` + string(must(json.Marshal(many[:300]))) + `}}`, 422, "at most"},
	} {
		code, body := s.rawRequest(t, "POST", "/v1/sandboxes", tk.Secret, []byte(bad.body), json1)
		if code != bad.code || !strings.Contains(body, bad.want) {
			t.Errorf("create %.60s: %d %.300s, want %d naming %q", bad.body, code, body, bad.code, bad.want)
		}
	}

	var sb api.Sandbox
	code, body = s.rawRequest(t, "POST", "/v1/sandboxes", "", []byte(`{"image":"busybox","always_on":true,"network_rules":{"mirror":true,"npm":false}}`), json1)
	if code != 201 || json.Unmarshal([]byte(body), &sb) != nil || sb.Network == nil || strings.Join(sb.Network.Egress, ",") != "mirror" {
		t.Fatalf("create with network_rules: %d %s", code, body)
	}
	defer func() { _, _ = s.C.Delete(ctx, sb.ID) }()
	reach := func(dst string) bool {
		r := s.sh(t, sb.ID, "nc -w 3 "+dst+" </dev/null")
		return r.ExitCode == 0 && r.Stdout == "hello"
	}
	if !reach(nettest.MirrorName + " 443") {
		t.Fatalf("the rule's name and port unreachable\n%s", tail(s.logs.String(), 20))
	}
	if reach(nettest.MirrorName + " 80") {
		t.Errorf("a port the rule does not list reachable")
	}
	// The rule changes: port 80 instead of 443, and a CIDR. A loop in the
	// sandbox, started before, notes (in the kernel's uptime, the host's
	// clock too) when the CIDR's port 80 answers.
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Background: true,
		Cmd: "while ! nc -w 1 " + nettest.Elsewhere + " 80 </dev/null | grep -q hello; do :; done; cut -d' ' -f1 /proc/uptime > /tmp/changed"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the loop runs
	before := uptime(t)
	code, body = put("", "mirror", api.NetworkRule{Hosts: []string{nettest.MirrorName}, CIDRs: []string{nettest.Elsewhere}, Ports: []int{80}})
	if code != 200 || !strings.Contains(body, `"version":2`) {
		t.Fatalf("change rule: %d %s", code, body)
	}
	answered := uptime(t)
	changed := time.Now()
	time.Sleep(time.Until(changed.Add(time.Second)))
	if r := s.sh(t, sb.ID, "cat /tmp/changed"); r.ExitCode != 0 {
		t.Errorf("a second after the rule changed, the loop in the sandbox has not reached its CIDR: %q", r.Stderr)
	} else if at, err := strconv.ParseFloat(strings.TrimSpace(r.Stdout), 64); err == nil {
		t.Logf("rule change: PUT answered in %.0f ms; in effect in the sandbox %.0f ms after the PUT was sent (10 ms resolution)",
			(answered-before)*1000, (at-before)*1000)
		if at-before > 1 {
			t.Errorf("the change took %.2f s to reach the sandbox", at-before)
		}
	}
	if !reach(nettest.MirrorName+" 80") || !reach(nettest.Elsewhere+" 80") {
		t.Errorf("a second after the rule changed, the sandbox does not reach what it now lists")
	}
	if reach(nettest.MirrorName + " 443") {
		t.Errorf("a second after the rule changed, the port it no longer lists is reachable")
	}
	// Deleted: the rule stands for nothing.
	if code, body := s.rawRequest(t, "DELETE", "/v1/network-rules/mirror", "", nil, nil); code != 200 {
		t.Fatalf("delete rule: %d %s", code, body)
	}
	time.Sleep(time.Second)
	if reach(nettest.Elsewhere + " 80") {
		t.Errorf("a deleted rule's CIDR still reachable")
	}

	// "internet": public addresses only; names resolve, private
	// addresses (the fake internet is 10/8) stay closed unless listed.
	code, body = s.rawRequest(t, "POST", "/v1/sandboxes", "", []byte(`{"image":"busybox","network":{"egress":"internet"}}`), json1)
	var inet api.Sandbox
	if code != 201 || json.Unmarshal([]byte(body), &inet) != nil {
		t.Fatalf("create with internet: %d %s", code, body)
	}
	defer func() { _, _ = s.C.Delete(ctx, inet.ID) }()
	if r := s.sh(t, inet.ID, "nslookup "+nettest.MirrorName); r.ExitCode != 0 || !strings.Contains(r.Stdout, nettest.Mirror) {
		t.Errorf("internet: name not resolved: %q %q", r.Stdout, r.Stderr)
	}
	if r := s.sh(t, inet.ID, "nc -w 3 "+nettest.MirrorName+" 443 </dev/null"); r.ExitCode == 0 || r.Stdout == "hello" {
		t.Errorf("internet reaches a private address: %q", r.Stdout)
	}
	if n, err := s.C.Network(ctx, inet.ID); err != nil || n.DeniedBy["private"] == 0 {
		t.Errorf("internet's refusal of a private address not counted: %+v %v", n, err)
	}
}

// uptime is the kernel's uptime in seconds (/proc/uptime; a sandbox reads
// the same clock).
func uptime(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestNetworkChangeIsTrajectoryStep: replacing a recording sandbox's
// egress list is a step of its trajectory, with the list.
func TestNetworkChangeIsTrajectoryStep(t *testing.T) {
	s := startServer(t, "--net-pool", fmt.Sprintf("10.213.%d.0/24", 20+(os.Getpid()+73)%100))
	ctx := t.Context()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "net-steps", Network: &api.NetworkSpec{Egress: []string{"10.1.2.0/24:443"}}})
	if r := s.sh(t, sb.ID, "true"); r.ExitCode != 0 {
		t.Fatal(r.Stderr)
	}
	if _, err := s.C.SetNetwork(ctx, sb.ID, []string{"10.9.9.9:80/tcp"}); err != nil {
		t.Fatal(err)
	}
	code, body := s.rawRequest(t, "GET", "/v1/trajectories/net-steps", "", nil, nil)
	var page api.TrajectoryPage
	if code != 200 || json.Unmarshal([]byte(body), &page) != nil {
		t.Fatalf("trajectory: %d %s", code, body)
	}
	if len(page.Steps) != 2 || page.Steps[1].Op != "network" || strings.Join(page.Steps[1].Egress, ",") != "10.9.9.9/32:80/tcp" || page.Steps[1].Step != 2 {
		t.Errorf("steps: %s", body)
	}
	// A client that resumes re-issues the steps: the change is served
	// from the log, and another list diverges.
	re, err := s.C.Create(ctx, api.CreateSandboxRequest{Trajectory: "net-steps", Resume: true})
	if err != nil || re.ID != sb.ID {
		t.Fatalf("resume: %+v %v, want %s", re, err, sb.ID)
	}
	if r := s.sh(t, sb.ID, "true"); !r.Replayed {
		t.Errorf("step 1 not replayed: %+v", r)
	}
	if _, err := s.C.SetNetwork(ctx, sb.ID, []string{"10.9.9.9:80/tcp"}); err != nil {
		t.Errorf("re-issued network step: %v", err)
	}
	if _, err := s.C.SetNetwork(ctx, sb.ID, []string{"10.9.9.9:81/tcp"}); err != nil {
		t.Errorf("a new network step after the log: %v", err)
	}
	if page, err := s.C.Trajectory(ctx, "net-steps", 0, 100); err != nil || len(page.Steps) != 3 || page.Steps[2].Egress[0] != "10.9.9.9/32:81/tcp" {
		t.Errorf("steps after the resume: %+v %v", page, err)
	}
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
