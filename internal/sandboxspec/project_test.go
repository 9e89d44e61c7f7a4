package sandboxspec

import (
	"strings"
	"testing"
)

func FuzzValidProject(f *testing.F) {
	for _, s := range []string{"", "a", "acme.rl", "a..b", ".a", "a.", "A", "a-", strings.Repeat("a.", 300) + "a", "a.b.c.d.e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if !ValidProject(id) {
			return
		}
		parts := strings.Split(id, ".")
		for i := range parts {
			if !ValidProjectName(parts[i]) {
				t.Fatalf("%q valid but part %q is not", id, parts[i])
			}
			anc := strings.Join(parts[:i+1], ".")
			if !Within(id, anc) || !Within(id, "") {
				t.Fatalf("%q not within its ancestor %q", id, anc)
			}
		}
		if Within(id, id+"x") || (len(parts) > 0 && Within(id, parts[0]+"x")) {
			t.Fatalf("%q within a sibling", id)
		}
	})
}
