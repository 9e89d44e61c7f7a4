package bus

import (
	"strings"
	"testing"
)

func FuzzParseRoster(f *testing.F) {
	f.Add([]byte("sb-a-1 p\nsb-a-2 p.q\n"))
	f.Add([]byte("\n\n x\nsb-a-3\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := map[string]string{}
		ParseRoster(b, m)
		for id, project := range m {
			if id == "" || strings.ContainsAny(id, " \n") || strings.Contains(project, "\n") {
				t.Fatalf("bad entry %q -> %q", id, project)
			}
		}
	})
}

func TestParseRoster(t *testing.T) {
	m := map[string]string{}
	ParseRoster([]byte("sb-a-1 p\nsb-a-2 p.q\n\nsb-a-3\n"), m)
	if len(m) != 3 || m["sb-a-1"] != "p" || m["sb-a-2"] != "p.q" || m["sb-a-3"] != "" {
		t.Fatalf("%v", m)
	}
}
