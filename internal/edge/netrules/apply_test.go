package netrules

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

// A change of a rule is set again on every running (or paused) sandbox
// whose list names it, with the rule's new destinations, and on no other;
// a deleted rule stands for nothing there. The load itself sets nothing.
func TestChangedRuleReapplied(t *testing.T) {
	a := networked("a", "pypi", "10.0.0.1")
	b := networked("b", "corp")
	paused := networked("paused", "pypi")
	paused.view.State = api.StatePaused
	stopping := networked("creating", "pypi")
	stopping.view.State = api.StateCreating
	noNet := networked("nonet", "pypi")
	noNet.view.Handle.Net = nil
	noContainer := networked("nocontainer", "pypi")
	noContainer.view.Handle = nil
	loopback := networked("loopback")
	loopback.view.Spec = nil
	h := newHost(t, a, b, paused, stopping, noNet, noContainer, loopback)
	rt := &fakeRuntime{}
	src := newSource(ruleRec(t, pypi), ruleRec(t, corp))
	watched(t, h, rt, src)
	if len(rt.set) != 0 {
		t.Fatalf("the load set lists: %v", rt.set)
	}

	changed := pypi
	changed.Hosts = []string{"pypi.org"}
	changed.Ports = []int{443, 80}
	src.change(ruleRec(t, changed))
	want := [][]string{{"pypi.org:443", "pypi.org:80", "10.0.0.1/32"}}
	if got := rt.sets("a"); !reflect.DeepEqual(got, want) {
		t.Errorf("a after the change: %q, want %q", got, want)
	}
	if got, want := rt.sets("paused"), [][]string{{"pypi.org:443", "pypi.org:80"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("paused after the change: %q, want %q", got, want)
	}
	for _, id := range []string{"b", "creating", "nonet", "nocontainer", "loopback"} {
		if got := rt.sets(id); got != nil {
			t.Errorf("%s was set: %q", id, got)
		}
	}

	src.change(bus.RecordUpdate{Key: "pypi"})
	want = append(want, []string{"10.0.0.1/32"})
	if got := rt.sets("a"); !reflect.DeepEqual(got, want) {
		t.Errorf("a after the deletion: %q, want %q", got, want)
	}
	if got := rt.sets("paused"); len(got) != 2 || len(got[1]) != 0 {
		t.Errorf("paused after the deletion: %q, want an empty list", got)
	}

	src.change(bus.RecordUpdate{Key: "corp", Raw: []byte("[]")})
	if got := rt.sets("b"); got != nil {
		t.Errorf("a record that is not a rule was applied: %q", got)
	}
	if len(a.recorded)+len(b.recorded) != 0 {
		t.Error("applying a rule again changed a record")
	}
}

// Apply("") reaches every sandbox that names some rule (rules changed
// while the node was down), and none with only literal entries.
func TestApplyAnyRule(t *testing.T) {
	a := networked("a", "pypi")
	b := networked("b", "internet", "corp")
	c := networked("c", "internet", "github.com:443")
	h := newHost(t, a, b, c)
	rt := &fakeRuntime{}
	r := watched(t, h, rt, newSource(ruleRec(t, pypi), ruleRec(t, corp)))
	r.Apply("")
	if got := rt.sets("a"); !reflect.DeepEqual(got, [][]string{{"pypi.org:443", "*.pythonhosted.org:443"}}) {
		t.Errorf("a: %q", got)
	}
	if got := rt.sets("b"); !reflect.DeepEqual(got, [][]string{{"internet", "10.1.0.0/16:53/udp"}}) {
		t.Errorf("b: %q", got)
	}
	if got := rt.sets("c"); got != nil {
		t.Errorf("c names no rule and was set: %q", got)
	}
}

// A runtime that cannot set a list is left alone; a failure to set one is
// logged and the other sandboxes are set still.
func TestApplyFailures(t *testing.T) {
	a := networked("a", "pypi")
	h := newHost(t, a)
	r := watched(t, h, plainRuntime{}, newSource(ruleRec(t, pypi)))
	r.Apply("pypi") // no NetworkSetter: must not panic

	rt := &fakeRuntime{setErr: errors.New("nft: busy")}
	b := networked("b", "pypi")
	h = newHost(t, a, b)
	r = watched(t, h, rt, newSource(ruleRec(t, pypi)))
	r.Apply("pypi")
	log := h.logged()
	for _, id := range []string{"a", "b"} {
		if !strings.Contains(log, `msg="edge: apply a changed network rule" rule=pypi id=`+id+` err="nft: busy"`) {
			t.Errorf("no warning for %s in %q", id, log)
		}
	}
}
