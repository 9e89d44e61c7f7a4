package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/agentproto"
)

// TestIdentityOutsideAVM: the identity op (fork from memory) is a VM's
// agent's alone: an agent that is not PID 1 of its own kernel (a
// container's shares the host's hostname files and random pool) refuses
// it and changes nothing; a malformed request is refused first.
func TestIdentityOutsideAVM(t *testing.T) {
	a := New(nil)
	good := agentproto.IdentityRequest{Hostname: "child", MachineID: strings.Repeat("ab", 16), Entropy: make([]byte, 64)}
	for _, c := range []struct {
		name, want string
		req        agentproto.IdentityRequest
	}{
		{"not a VM", "only the agent of a VM", good},
		{"no hostname", "hostname", agentproto.IdentityRequest{MachineID: good.MachineID, Entropy: good.Entropy}},
		{"short machine id", "machine id", agentproto.IdentityRequest{Hostname: "x", MachineID: "abcd", Entropy: good.Entropy}},
		{"little entropy", "entropy", agentproto.IdentityRequest{Hostname: "x", MachineID: good.MachineID, Entropy: make([]byte, 8)}},
	} {
		err := a.identity(&c.req)
		var ae *agentproto.Error
		if !errors.As(err, &ae) || ae.Code != agentproto.ErrInvalid || !strings.Contains(ae.Message, c.want) {
			t.Errorf("%s: %v, want ErrInvalid about %q", c.name, err, c.want)
		}
	}
}
