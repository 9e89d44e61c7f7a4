package netrules

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

var (
	pypi  = api.NetworkRule{Name: "pypi", Hosts: []string{"pypi.org", "*.pythonhosted.org"}, Ports: []int{443}}
	corp  = api.NetworkRule{Name: "corp", CIDRs: []string{"10.1.0.0/16"}, Ports: []int{53}, Protocols: []string{"udp"}}
	other = api.NetworkRule{Name: "other", Hosts: []string{"example.com"}}
)

// The watch loads the records as they stand: get answers each by its
// key, skips a record that is not a rule, and forgets a deleted one.
func TestWatchLoadsAndGet(t *testing.T) {
	h := newHost(t)
	src := newSource(ruleRec(t, pypi), ruleRec(t, corp), bus.RecordUpdate{Key: "broken", Raw: []byte("{not json")})
	r := watched(t, h, &fakeRuntime{}, src)
	nr, ok := r.get("pypi")
	if !ok || !reflect.DeepEqual(nr.Hosts, pypi.Hosts) {
		t.Fatalf("get(pypi) = %+v, %v; want the rule", nr, ok)
	}
	if _, ok := r.get("broken"); ok {
		t.Fatal("a record that is not a rule was kept")
	}
	if _, ok := r.get("nope"); ok {
		t.Fatal("get of an unknown rule answered one")
	}
	src.change(bus.RecordUpdate{Key: "corp"})
	if _, ok := r.get("corp"); ok {
		t.Fatal("a deleted rule is still known")
	}
	src.change(ruleRec(t, other))
	if _, ok := r.get("other"); !ok {
		t.Fatal("a rule added after the load is unknown")
	}
}

// Watch forgets the rules of an earlier watch.
func TestWatchStartsAfresh(t *testing.T) {
	h := newHost(t)
	r := watched(t, h, &fakeRuntime{}, newSource(ruleRec(t, pypi)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.Watch(ctx, newSource(ruleRec(t, corp))); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.get("pypi"); ok {
		t.Fatal("a rule of the earlier watch is still known")
	}
	if _, ok := r.get("corp"); !ok {
		t.Fatal("the new watch's rule is unknown")
	}
}

func TestWatchFails(t *testing.T) {
	h := newHost(t)
	r := New(h, &fakeRuntime{})
	boom := errors.New("bucket gone")
	if err := r.Watch(context.Background(), &fakeSource{err: boom}); !errors.Is(err, boom) {
		t.Fatalf("a failed watch: %v, want %v", err, boom)
	}

	ctx, cancel := context.WithCancel(context.Background())
	src := newSource()
	src.noReady = true
	cancel()
	if err := r.Watch(ctx, src); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled watch: %v", err)
	}

	defer func(d time.Duration) { answerWait = d }(answerWait)
	answerWait = 10 * time.Millisecond
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	err := r.Watch(ctx, src)
	if err == nil || err.Error() != "edge: network rules: no answer from "+bus.BucketNetworkRules {
		t.Fatalf("no answer: %v", err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		egress []string
		rule   string
		want   bool
	}{
		{[]string{"pypi", "10.0.0.1"}, "pypi", true},
		{[]string{"pypi"}, "corp", false},
		{[]string{"10.0.0.0/8", "github.com:443"}, "github.com", false},
		{[]string{"pypi"}, "", true},
		{[]string{"internet", "10.0.0.1", "github.com"}, "", false},
		{[]string{"internet", "corp"}, "", true},
		{nil, "", false},
	} {
		if got := names(tc.egress, tc.rule); got != tc.want {
			t.Errorf("names(%q, %q) = %v, want %v", tc.egress, tc.rule, got, tc.want)
		}
	}
}

// Resolve keeps literal entries, expands a rule into its destinations
// (each host or CIDR by each port) and refuses an unknown rule unless
// lenient.
func TestResolve(t *testing.T) {
	h := newHost(t)
	r := watched(t, h, &fakeRuntime{}, newSource(ruleRec(t, pypi), ruleRec(t, corp)))
	if rn, err := r.Resolve(nil, false); rn != nil || err != nil {
		t.Fatalf("Resolve(nil) = %v, %v; want loopback only", rn, err)
	}
	n := &api.NetworkSpec{Egress: []string{"github.com:443", "pypi", "corp", "internet"}, Group: "g", MaxConns: 9}
	rn, err := r.Resolve(n, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"github.com:443", "pypi.org:443", "*.pythonhosted.org:443", "10.1.0.0/16:53/udp", "internet"}
	if got := strs(rn.Egress); !reflect.DeepEqual(got, want) {
		t.Fatalf("egress %q, want %q", got, want)
	}
	if rn.Group != "" || rn.MaxConns != 0 {
		t.Fatalf("Resolve set more than the egress: %+v", rn)
	}

	n = &api.NetworkSpec{Egress: []string{"10.0.0.1", "gone", "pypi"}}
	_, err = r.Resolve(n, false)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeBadRequest ||
		ae.Message != `network.egress: network rule "gone" is unknown (GET /v1/network-rules lists them)` {
		t.Fatalf("strict, an unknown rule: %v", err)
	}
	rn, err = r.Resolve(n, true)
	if err != nil {
		t.Fatalf("lenient, an unknown rule: %v", err)
	}
	if got, want := strs(rn.Egress), []string{"10.0.0.1/32", "pypi.org:443", "*.pythonhosted.org:443"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("lenient egress %q, want %q", got, want)
	}
	rn, err = r.Resolve(&api.NetworkSpec{Egress: []string{"gone"}}, true)
	if err != nil || rn == nil || len(rn.Egress) != 0 {
		t.Fatalf("lenient, only an unknown rule: %v, %v; want an empty list", rn, err)
	}

	for _, lenient := range []bool{false, true} {
		_, err = r.Resolve(&api.NetworkSpec{Egress: []string{"not an entry!"}}, lenient)
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalid || !strings.HasPrefix(ae.Message, "network.") {
			t.Fatalf("lenient %v, a bad entry: %v", lenient, err)
		}
	}
}

// A list expanded past api.MaxExpandedEgress is refused, in either mode.
func TestResolveBound(t *testing.T) {
	big := api.NetworkRule{Name: "big"}
	for i := range 300 {
		big.CIDRs = append(big.CIDRs, fmt.Sprintf("10.0.%d.%d", i/256, i%256))
	}
	big.Ports = []int{80, 443}
	h := newHost(t)
	r := watched(t, h, &fakeRuntime{}, newSource(ruleRec(t, big)))
	rn, err := r.Resolve(&api.NetworkSpec{Egress: []string{"big"}}, false)
	if err != nil || len(rn.Egress) != 600 {
		t.Fatalf("600 destinations: %v", err)
	}
	for _, lenient := range []bool{false, true} {
		_, err = r.Resolve(&api.NetworkSpec{Egress: []string{"big", "big"}}, lenient)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalid ||
			ae.Message != fmt.Sprintf("network.egress: 1200 destinations once its rules are expanded, at most %d", api.MaxExpandedEgress) {
			t.Fatalf("lenient %v, 1,200 destinations: %v", lenient, err)
		}
	}
}
