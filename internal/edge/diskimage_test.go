package edge

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestCheckDiskImage: a VM disk image boots on the vm tier only (with a
// network or without), without named layers; each refusal is a 422 that
// says why, and an image of layers is not concerned.
func TestCheckDiskImage(t *testing.T) {
	disk := &ResolvedImage{Disk: "/var/lib/warren/disks/x.qcow2"}
	for _, c := range []struct {
		name string
		spec api.CreateSandboxRequest
		img  *ResolvedImage
		want string // "" = accepted
	}{
		{"vm", api.CreateSandboxRequest{Image: "d", Tier: api.TierVM}, disk, ""},
		{"microvm", api.CreateSandboxRequest{Image: "d", Tier: api.TierMicroVM}, disk, `create it with tier "vm"`},
		{"layers", api.CreateSandboxRequest{Image: "d", Tier: api.TierVM, Layers: []api.LayerAttachment{{Layer: "l"}}}, disk, "takes no layers"},
		{"network", api.CreateSandboxRequest{Image: "d", Tier: api.TierVM, Network: &api.NetworkSpec{}}, disk, ""},
		{"layers image with a network", api.CreateSandboxRequest{Image: "b", Tier: api.TierVM, Network: &api.NetworkSpec{}}, &ResolvedImage{}, ""},
	} {
		err := checkDiskImage(&c.spec, c.img)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		ae, ok := err.(*api.Error)
		if !ok || ae.Code != api.CodeInvalid || !strings.Contains(ae.Message, c.want) {
			t.Errorf("%s: %v, want a 422 saying %q", c.name, err, c.want)
		}
	}
}
