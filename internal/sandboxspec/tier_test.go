package sandboxspec

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestNormalizeUnknownTier: an unknown tier is a bad request (400) whose
// message lists the tiers.
func TestNormalizeUnknownTier(t *testing.T) {
	req := &api.CreateSandboxRequest{Image: "busybox", Tier: "quantum"}
	aerr := Normalize(req)
	if aerr == nil || aerr.Code != api.CodeBadRequest || !strings.Contains(aerr.Message, strings.Join(api.Tiers, ", ")) {
		t.Fatalf("unknown tier: %+v, want code %s listing %v", aerr, api.CodeBadRequest, api.Tiers)
	}
	for _, tier := range api.Tiers {
		req := &api.CreateSandboxRequest{Image: "busybox", Tier: tier}
		if aerr := Normalize(req); aerr != nil && strings.Contains(aerr.Message, "unknown") {
			t.Errorf("tier %s: %v", tier, aerr)
		}
	}
}
