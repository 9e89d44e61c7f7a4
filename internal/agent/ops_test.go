package agent

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/agentproto"
)

// dispatch keeps each op's phase: ping and setup always, the edge's own
// steps (wipe, reroot, resume) once set up, everything else (an unknown
// op too) as a request in flight that a recycling sandbox refuses.
func TestDispatchPhases(t *testing.T) {
	ctx := context.Background()
	code := func(err error) string {
		var pe *agentproto.Error
		if errors.As(err, &pe) {
			return pe.Code
		}
		return ""
	}
	a := &Agent{}
	if v, err := a.dispatch(ctx, nil, &agentproto.Request{Op: agentproto.OpPing}); err != nil || v.(*agentproto.PingResult).Proto != agentproto.Proto {
		t.Fatalf("ping before setup: %v, %v", v, err)
	}
	for _, op := range []string{agentproto.OpWipe, agentproto.OpExec, "frobnicate"} {
		_, err := a.dispatch(ctx, nil, &agentproto.Request{Op: op})
		if code(err) != agentproto.ErrInvalid || !strings.Contains(err.Error(), "not set up") {
			t.Errorf("%s before setup: %v, want not set up", op, err)
		}
	}
	a.setup, a.wiped = true, true
	for _, op := range []string{agentproto.OpExec, agentproto.OpFileStat, "frobnicate"} {
		_, err := a.dispatch(ctx, nil, &agentproto.Request{Op: op})
		if code(err) != agentproto.ErrUnusable {
			t.Errorf("%s while wiped: %v, want %s", op, err, agentproto.ErrUnusable)
		}
	}
	// reroot is not a request: a wiped sandbox takes it (here its body is
	// refused, which shows it got past the phase check).
	_, err := a.dispatch(ctx, nil, &agentproto.Request{Op: agentproto.OpReroot, Body: []byte(`[`)})
	if code(err) != agentproto.ErrInvalid || !strings.Contains(err.Error(), "bad body") {
		t.Errorf("reroot while wiped: %v, want its bad body refused", err)
	}
	a.wiped = false
	_, err = a.dispatch(ctx, nil, &agentproto.Request{Op: "frobnicate"})
	if code(err) != agentproto.ErrInvalid || !strings.Contains(err.Error(), "unknown op") {
		t.Errorf("unknown op: %v", err)
	}
	if a.inflight != 0 {
		t.Errorf("%d requests left in flight", a.inflight)
	}
}
