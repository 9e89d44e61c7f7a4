package netrules

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestRead(t *testing.T) {
	a := networked("a", "pypi", "10.0.0.1")
	stopped := networked("stopped", "pypi")
	stopped.view.Handle = nil
	loopback := networked("loopback")
	loopback.view.Spec = nil
	h := newHost(t, a, stopped, loopback)
	rt := &fakeRuntime{
		denied: map[string]int64{"not-allowed": 3, "dns": 2},
		dests:  []api.NetworkDenial{{Destination: "1.2.3.4:443", Count: 3}},
	}
	r := New(h, rt)

	got, err := r.Read("a")
	if err != nil {
		t.Fatal(err)
	}
	want := &api.SandboxNetwork{ID: "a", Enabled: true, Address: "10.0.0.2", Gateway: "10.0.0.1",
		Egress: []string{"pypi", "10.0.0.1"}, Denied: 5, DeniedBy: map[string]int64{"not-allowed": 3, "dns": 2},
		DeniedDestinations: []api.NetworkDenial{{Destination: "1.2.3.4:443", Count: 3}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Read(a) = %+v\nwant %+v", got, want)
	}

	got, err = r.Read("stopped")
	if err != nil || !got.Enabled || got.Address != "" || got.Denied != 0 || !reflect.DeepEqual(got.Egress, []string{"pypi"}) {
		t.Fatalf("Read(stopped) = %+v, %v; want its list and no address", got, err)
	}
	got, err = r.Read("loopback")
	if err != nil || got.Enabled || got.Egress == nil || got.DeniedBy == nil || got.DeniedDestinations == nil {
		t.Fatalf("Read(loopback) = %+v, %v; want disabled, empty (not nil) lists", got, err)
	}
	if !reflect.DeepEqual(rt.reportedOn, []string{"a"}) {
		t.Fatalf("the kernel was asked about %v, want only a", rt.reportedOn)
	}
	if _, err := r.Read("nope"); err == nil || !strings.Contains(err.Error(), "nope not found") {
		t.Fatalf("Read(nope): %v", err)
	}

	if got, err := New(h, plainRuntime{}).Read("a"); err != nil || got.Address != "10.0.0.2" || got.Denied != 0 {
		t.Fatalf("no reporter: %+v, %v", got, err)
	}
	rt.deniedErr = errors.New("netlink: busy")
	var ae *api.Error
	if _, err := r.Read("a"); !errors.As(err, &ae) || ae.Code != api.CodeConflict ||
		ae.Message != "sandbox a (running): network counters cannot be read now: netlink: busy" {
		t.Fatalf("counters fail: %v", err)
	}
	rt.deniedErr, rt.destsErr = nil, errors.New("netlink: gone")
	if _, err := r.Read("a"); !errors.As(err, &ae) || ae.Code != api.CodeConflict ||
		ae.Message != "sandbox a (running): network record cannot be read now: netlink: gone" {
		t.Fatalf("record fails: %v", err)
	}
}

// Set resolves the new list strictly, sets it in the runtime, records it
// with the sandbox's group, rates and limit, and answers the network.
func TestSet(t *testing.T) {
	a := networked("a", "10.0.0.1")
	a.view.Spec.Group, a.view.Spec.EgressRateMbit, a.view.Spec.IngressRateMbit, a.view.Spec.MaxConns = "g", 10, 20, 30
	h := newHost(t, a)
	rt := &fakeRuntime{}
	r := watched(t, h, rt, newSource(ruleRec(t, pypi)))

	got, err := r.Set("a", &api.NetworkSpec{Egress: []string{"pypi"}})
	if err != nil {
		t.Fatal(err)
	}
	if !a.waited {
		t.Error("Set did not wait for the creation")
	}
	if sets := rt.sets("a"); !reflect.DeepEqual(sets, [][]string{{"pypi.org:443", "*.pythonhosted.org:443"}}) {
		t.Fatalf("set %q", sets)
	}
	want := &api.NetworkSpec{Egress: []string{"pypi"}, Group: "g", EgressRateMbit: 10, IngressRateMbit: 20, MaxConns: 30}
	if len(a.recorded) != 1 || !reflect.DeepEqual(a.recorded[0], want) {
		t.Fatalf("recorded %+v, want %+v", a.recorded, want)
	}
	if !got.Enabled || !reflect.DeepEqual(got.Egress, []string{"pypi"}) || got.Address != "10.0.0.2" {
		t.Fatalf("answer %+v", got)
	}

	// The same group may be named again.
	if _, err := r.Set("a", &api.NetworkSpec{Egress: []string{"10.0.0.3"}, Group: "g"}); err != nil {
		t.Fatalf("the same group: %v", err)
	}
	// A record that cannot be written is logged; the change stands.
	a.recordErr = errors.New("disk full")
	if _, err := r.Set("a", &api.NetworkSpec{Egress: []string{"10.0.0.4"}}); err != nil {
		t.Fatalf("a failed record: %v", err)
	}
	if log := h.logged(); !strings.Contains(log, `msg="record network change" id=a err="disk full"`) {
		t.Fatalf("no warning in %q", log)
	}
	if len(a.recorded) != 3 || !reflect.DeepEqual(a.view.Spec.Egress, []string{"10.0.0.4"}) {
		t.Fatalf("the change after a failed record: %+v", a.view.Spec)
	}
}

func TestSetRefused(t *testing.T) {
	a := networked("a", "10.0.0.1")
	a.view.Spec.Group = "g"
	loopback := networked("loopback")
	loopback.view.Spec = nil
	stopped := networked("stopped", "10.0.0.1")
	stopped.view.State = api.StateStopped
	noNet := networked("nonet", "10.0.0.1")
	noNet.view.Handle.Net = nil
	h := newHost(t, a, loopback, stopped, noNet)
	rt := &fakeRuntime{}
	r := watched(t, h, rt, newSource())
	n := func(egress ...string) *api.NetworkSpec { return &api.NetworkSpec{Egress: egress} }

	for _, tc := range []struct {
		id   string
		n    *api.NetworkSpec
		code string
		msg  string
	}{
		{"a", n("gone"), api.CodeBadRequest, `network.egress: network rule "gone" is unknown (GET /v1/network-rules lists them)`},
		{"nope", n("10.0.0.2"), api.CodeNotFound, "sandbox nope not found"},
		{"loopback", n("10.0.0.2"), api.CodeConflict, "sandbox loopback was created without network (loopback only): its network cannot be changed"},
		{"stopped", n("10.0.0.2"), api.CodeConflict, "sandbox stopped is stopped: its network cannot be changed"},
		{"nonet", n("10.0.0.2"), api.CodeConflict, "sandbox nonet is running: its network cannot be changed"},
		{"a", &api.NetworkSpec{Egress: []string{"10.0.0.2"}, Group: "h"}, api.CodeConflict, `sandbox a: network.group is set at create only (it is "g")`},
	} {
		lookups := h.lookups
		_, err := r.Set(tc.id, tc.n)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != tc.code || ae.Message != tc.msg {
			t.Errorf("Set(%s, %v): %v, want %s %q", tc.id, tc.n.Egress, err, tc.code, tc.msg)
		}
		if tc.code == api.CodeBadRequest && h.lookups != lookups {
			t.Errorf("Set(%s, %v) looked the sandbox up before refusing the list", tc.id, tc.n.Egress)
		}
	}
	if len(rt.set) != 0 {
		t.Fatalf("a refused change was set: %v", rt.set)
	}
	if len(a.recorded)+len(loopback.recorded)+len(stopped.recorded)+len(noNet.recorded) != 0 {
		t.Fatal("a refused change was recorded")
	}

	boom := errors.New("nft: busy")
	rt.setErr = boom
	if _, err := r.Set("a", n("10.0.0.2")); !errors.Is(err, boom) || err.Error() != "set network of a: nft: busy" {
		t.Fatalf("the runtime fails: %v", err)
	}
	if len(a.recorded) != 0 {
		t.Fatal("a change the runtime refused was recorded")
	}

	var ae *api.Error
	_, err := New(h, plainRuntime{}).Set("a", n("10.0.0.2"))
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || ae.Message != "this node's runtime cannot change a sandbox's network" {
		t.Fatalf("no setter: %v", err)
	}
}
