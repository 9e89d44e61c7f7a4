package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestNetworkEgressRate: a networked sandbox's uploads are held to its
// egress rate: network.egress_rate_mbit when its create sets one, else the
// node's --net-egress-rate-mbit; the drops are counted as rate-limit
// refusals. Only lower bounds of durations are asserted (a loaded machine
// only makes transfers slower).
func TestNetworkEgressRate(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 60+(os.Getpid()+30)%60)
	s := startServer(t, "--net-pool", pool, "--net-egress-rate-mbit", "16")
	ctx := context.Background()

	b := []byte(`{"image":"busybox","network":{"egress":[],"egress_rate_mbit":-1}}`)
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", "", b, map[string]string{"Content-Type": "application/json"})
	if code != 422 || !strings.Contains(body, "egress_rate_mbit") {
		t.Errorf("egress_rate_mbit -1: %d %s, want 422 naming it", code, body)
	}
	egress := []string{nettest.Mirror + ":" + nettest.HoldPort + "/tcp"}
	byNode := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress}})
	slow := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress, EgressRateMbit: 4}})
	fast := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress, EgressRateMbit: api.MaxEgressRateMbit}})
	if got, _ := s.C.Get(ctx, slow.ID); got == nil || got.Network == nil || got.Network.EgressRateMbit != 4 {
		t.Errorf("sandbox view: %+v", got)
	}
	// MB megabytes to the mirror's sink, which closes when the upload ends.
	upload := func(id string, mb int) time.Duration {
		t.Helper()
		t0 := time.Now()
		r := s.sh(t, id, fmt.Sprintf("head -c %d000000 /dev/zero | nc %s %s", mb, nettest.Mirror, nettest.HoldPort))
		d := time.Since(t0)
		if r.ExitCode != 0 || r.Stdout != "hello" {
			t.Fatalf("upload from %s: exit %d %q %q", id, r.ExitCode, r.Stdout, r.Stderr)
		}
		return d
	}
	dSlow, dNode, dFast := upload(slow.ID, 2), upload(byNode.ID, 6), upload(fast.ID, 6)
	t.Logf("2 MB at 4 Mbit/s %v; 6 MB at the node's 16 Mbit/s %v, unlimited %v", dSlow, dNode, dFast)
	// The kernel's bucket starts full: a second of the rate (and a tenth)
	// passes at once. 2 MB at 4 Mbit/s: 0.55 MB at once, the rest in 2.9 s;
	// 6 MB at 16 Mbit/s: 2.2 MB at once, the rest in 1.9 s.
	if dSlow < 2500*time.Millisecond {
		t.Errorf("2 MB at 4 Mbit/s took %v, want at least 2.5 s", dSlow)
	}
	if dNode < 1500*time.Millisecond {
		t.Errorf("6 MB at the node's 16 Mbit/s took %v, want at least 1.5 s", dNode)
	}
	if dFast > dNode/2 {
		t.Errorf("6 MB without a real limit took %v, at 16 Mbit/s %v: no difference", dFast, dNode)
	}
	for _, id := range []string{slow.ID, byNode.ID} {
		if n, err := s.C.Network(ctx, id); err != nil || n.DeniedBy["rate-limit"] == 0 {
			t.Errorf("rate-limit drops of %s not counted: %+v %v", id, n, err)
		}
	}
	// A change of the list keeps the rate.
	if _, err := s.C.SetNetwork(ctx, slow.ID, egress); err != nil {
		t.Fatal(err)
	}
	if d := upload(slow.ID, 2); d < 2500*time.Millisecond {
		t.Errorf("after a change of the list, 2 MB at 4 Mbit/s took %v", d)
	}
	for _, id := range []string{slow.ID, byNode.ID, fast.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestNetworkIngressRateAndQuota: a networked sandbox's downloads are held
// to its ingress rate (network.ingress_rate_mbit); a project's quota
// bounds the rates and the connection limit one of its sandboxes may ask
// for (more is 403 naming the project; a subproject's quota may not
// exceed it) and gives a create that asks none the quota's.
func TestNetworkIngressRateAndQuota(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 230+(os.Getpid()+10)%20)
	s := startServer(t, "--net-pool", pool)
	ctx := context.Background()
	json := map[string]string{"Content-Type": "application/json"}

	b := []byte(`{"image":"busybox","network":{"egress":[],"ingress_rate_mbit":100001}}`)
	if code, body := s.rawRequest(t, "POST", "/v1/sandboxes", "", b, json); code != 422 || !strings.Contains(body, "ingress_rate_mbit") {
		t.Errorf("ingress_rate_mbit 100001: %d %s, want 422 naming it", code, body)
	}
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "netq", Quota: api.Quota{EgressRateMbit: 8, IngressRateMbit: 4, MaxConns: 16}}); err != nil {
		t.Fatal(err)
	}
	tok, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "netq-lead", Project: "netq", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	p := warren.New(s.URL, tok.Secret)
	if _, err := p.CreateProject(ctx, api.CreateProjectRequest{Name: "sub", Quota: api.Quota{IngressRateMbit: 5}}); err == nil ||
		!strings.Contains(err.Error(), "ingress") {
		t.Errorf("a subproject's ingress quota over its parent's: %v, want 403", err)
	}
	if _, err := p.CreateProject(ctx, api.CreateProjectRequest{Name: "sub", Quota: api.Quota{EgressRateMbit: -1}}); err == nil {
		t.Errorf("a negative rate quota was accepted")
	}
	egress := []string{nettest.Mirror + ":" + nettest.SourcePort + "/tcp"}
	for _, n := range []api.NetworkSpec{{Egress: egress, EgressRateMbit: 9}, {Egress: egress, IngressRateMbit: 5}, {Egress: egress, MaxConns: 17}} {
		_, err := p.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: &n})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeForbidden || !strings.Contains(ae.Message, "netq") || !strings.Contains(ae.Message, "network.") {
			t.Errorf("create over the project's quota (%d/%d/%d): %v, want 403 naming the project", n.EgressRateMbit, n.IngressRateMbit, n.MaxConns, err)
		}
	}
	// Without rates: the quota's.
	byQuota, err := p.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{Egress: egress}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), byQuota.ID) })
	if got, _ := p.Get(ctx, byQuota.ID); got == nil || got.Network == nil || got.Network.EgressRateMbit != 8 || got.Network.IngressRateMbit != 4 ||
		got.Network.MaxConns != 16 {
		t.Errorf("a create without rates under a quota of 8/4 Mbit/s and 16 connections: %+v", got)
	}
	fast := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress}})
	// MB megabytes from the mirror's source.
	download := func(c *warren.Client, id string, mb int) time.Duration {
		t.Helper()
		t0 := time.Now()
		r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: fmt.Sprintf("nc %s %s | head -c %d000000 | wc -c", nettest.Mirror, nettest.SourcePort, mb)})
		d := time.Since(t0)
		if err != nil || strings.TrimSpace(r.Stdout) != fmt.Sprintf("%d000000", mb) {
			t.Fatalf("download in %s: %+v %v", id, r, err)
		}
		return d
	}
	dSlow, dFast := download(p, byQuota.ID, 2), download(s.C, fast.ID, 2)
	t.Logf("2 MB at 4 Mbit/s %v, unlimited %v", dSlow, dFast)
	// The bucket starts full (a burst of 64 KiB at this rate): 2 MB at
	// 4 Mbit/s take about 4 s; only a lower bound is asserted.
	if dSlow < 2500*time.Millisecond {
		t.Errorf("2 MB at 4 Mbit/s took %v, want at least 2.5 s", dSlow)
	}
	if dFast > dSlow/2 {
		t.Errorf("2 MB without a limit took %v, at 4 Mbit/s %v: no difference", dFast, dSlow)
	}
	if n, err := p.Network(ctx, byQuota.ID); err != nil || n.DeniedBy["ingress-rate-limit"] == 0 {
		t.Errorf("ingress-rate-limit drops not counted: %+v %v", n, err)
	}
	// Its connection limit, the quota's 16.
	probe, err := os.ReadFile(bins.probe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteFileBytes(ctx, byQuota.ID, "/probe", probe, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := p.Exec(ctx, byQuota.ID, api.ExecRequest{Cmd: "/probe conns " + nettest.Mirror + ":" + nettest.SourcePort + " 40 0 2>/dev/null"})
	var greeted int
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(r.Stdout, "greeted %d", &greeted); err != nil || greeted < 1 || greeted > 16 {
		t.Errorf("40 connections at once with a limit of 16: %q %q", r.Stdout, r.Stderr)
	}
	for _, id := range []string{byQuota.ID, fast.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}
