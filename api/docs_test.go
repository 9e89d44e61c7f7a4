package api_test

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestDocsCreateFields keeps docs/api.md's table of create fields (between
// the create-fields markers) equal to the CreateSandboxRequest schema of
// openapi.yaml and to api.CreateSandboxRequest: one source of truth for
// the fields, and their types.
func TestDocsCreateFields(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "<!-- create-fields")
	j := strings.Index(doc, "<!-- /create-fields -->")
	if i < 0 || j < i {
		t.Fatal("docs/api.md has no <!-- create-fields --> … <!-- /create-fields --> table")
	}
	documented := map[string]string{} // field -> type
	for _, line := range strings.Split(doc[i:j], "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if _, dup := documented[name]; dup {
			t.Errorf("docs/api.md lists create field %q twice", name)
		}
		documented[name] = strings.TrimSpace(cells[2])
	}
	spec := loadSpec(t)
	schema := mapAt(spec, "components", "schemas", "CreateSandboxRequest")
	props := mapAt(schema, "properties")
	for name, prop := range props {
		p, _ := prop.(map[string]any)
		if ref, ok := p["$ref"].(string); ok {
			p = resolve(spec, ref)
		}
		typ, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("create field %q is in openapi.yaml but not in docs/api.md's table", name)
		case typ != p["type"]:
			t.Errorf("create field %q: docs say %s, openapi.yaml %v", name, typ, p["type"])
		}
	}
	for name := range documented {
		if props[name] == nil {
			t.Errorf("docs/api.md documents create field %q, which openapi.yaml does not have", name)
		}
	}
	var goFields []string
	rt := reflect.TypeOf(api.CreateSandboxRequest{})
	for k := 0; k < rt.NumField(); k++ {
		name, _, _ := strings.Cut(rt.Field(k).Tag.Get("json"), ",")
		goFields = append(goFields, name)
		if _, ok := documented[name]; !ok {
			t.Errorf("api.CreateSandboxRequest field %q is not in docs/api.md's table", name)
		}
	}
	if len(goFields) != len(documented) {
		sort.Strings(goFields)
		t.Errorf("docs list %d create fields, the Go type has %d: %v", len(documented), len(goFields), goFields)
	}
}
