package api_test

import (
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
)

// The module has no YAML library among its requirements, so this test
// reads openapi.yaml with a small parser for the subset the file uses:
// block mappings and sequences, plain or quoted scalars, flow sequences
// ([a, b]), "{}"/"[]" and literal blocks (|). Keep the file in that subset.

type yline struct {
	indent int
	text   string // without indentation
	no     int
}

type yparser struct {
	lines []yline
	pos   int
}

func parseYAML(src string) (any, error) {
	p := &yparser{}
	raw := strings.Split(src, "\n")
	for i, l := range raw {
		t := strings.TrimLeft(l, " ")
		if strings.TrimSpace(t) == "" || strings.HasPrefix(t, "#") {
			// Blank lines matter only inside literal blocks; keep them as empty.
			p.lines = append(p.lines, yline{indent: -1, no: i + 1})
			continue
		}
		if strings.HasPrefix(t, "\t") {
			return nil, fmt.Errorf("line %d: tab indentation", i+1)
		}
		p.lines = append(p.lines, yline{indent: len(l) - len(t), text: strings.TrimRight(t, " "), no: i + 1})
	}
	p.skipBlank()
	if p.pos >= len(p.lines) {
		return nil, fmt.Errorf("empty document")
	}
	v, err := p.block(p.lines[p.pos].indent)
	if err != nil {
		return nil, err
	}
	p.skipBlank()
	if p.pos < len(p.lines) {
		return nil, fmt.Errorf("line %d: unexpected content", p.lines[p.pos].no)
	}
	return v, nil
}

func (p *yparser) skipBlank() {
	for p.pos < len(p.lines) && p.lines[p.pos].indent < 0 {
		p.pos++
	}
}

// block parses the mapping or sequence whose lines start at indent.
func (p *yparser) block(indent int) (any, error) {
	p.skipBlank()
	if strings.HasPrefix(p.lines[p.pos].text, "- ") || p.lines[p.pos].text == "-" {
		return p.sequence(indent)
	}
	return p.mapping(indent)
}

func (p *yparser) sequence(indent int) (any, error) {
	var out []any
	for {
		p.skipBlank()
		if p.pos >= len(p.lines) || p.lines[p.pos].indent != indent || !strings.HasPrefix(p.lines[p.pos].text, "- ") {
			if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
				return nil, fmt.Errorf("line %d: bad indentation", p.lines[p.pos].no)
			}
			return out, nil
		}
		l := p.lines[p.pos]
		rest := l.text[2:]
		if k, _, isMap := splitKey(rest); isMap && k != "" {
			// "- key: value" starts a mapping indented by two more columns.
			p.lines[p.pos] = yline{indent: indent + 2, text: rest, no: l.no}
			m, err := p.mapping(indent + 2)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
			continue
		}
		p.pos++
		v, err := scalar(rest, l.no)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
}

// splitKey splits "key: value" or "key:"; keys may be quoted.
func splitKey(s string) (key, value string, ok bool) {
	if strings.HasPrefix(s, "'") || strings.HasPrefix(s, `"`) {
		q := s[:1]
		end := strings.Index(s[1:], q)
		if end < 0 {
			return "", "", false
		}
		key, rest := s[1:end+1], s[end+2:]
		if rest == ":" {
			return key, "", true
		}
		if strings.HasPrefix(rest, ": ") {
			return key, strings.TrimSpace(rest[2:]), true
		}
		return "", "", false
	}
	if strings.HasSuffix(s, ":") && !strings.Contains(s, ": ") {
		return s[:len(s)-1], "", true
	}
	if i := strings.Index(s, ": "); i > 0 {
		return s[:i], strings.TrimSpace(s[i+2:]), true
	}
	return "", "", false
}

func (p *yparser) mapping(indent int) (any, error) {
	out := map[string]any{}
	for {
		p.skipBlank()
		if p.pos >= len(p.lines) || p.lines[p.pos].indent < indent {
			return out, nil
		}
		l := p.lines[p.pos]
		if l.indent > indent {
			return nil, fmt.Errorf("line %d: bad indentation", l.no)
		}
		key, val, ok := splitKey(l.text)
		if !ok {
			return nil, fmt.Errorf("line %d: want key: value, got %q", l.no, l.text)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("line %d: duplicate key %q", l.no, key)
		}
		p.pos++
		switch {
		case val == "|" || val == "|-" || val == ">":
			var b strings.Builder
			for p.pos < len(p.lines) && (p.lines[p.pos].indent < 0 || p.lines[p.pos].indent > indent) {
				b.WriteString(p.lines[p.pos].text + "\n")
				p.pos++
			}
			out[key] = b.String()
		case val == "":
			p.skipBlank()
			if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
				v, err := p.block(p.lines[p.pos].indent)
				if err != nil {
					return nil, err
				}
				out[key] = v
			} else {
				out[key] = nil
			}
		default:
			v, err := scalar(val, l.no)
			if err != nil {
				return nil, err
			}
			out[key] = v
		}
	}
}

func scalar(s string, no int) (any, error) {
	switch {
	case s == "{}":
		return map[string]any{}, nil
	case s == "[]":
		return []any{}, nil
	case strings.HasPrefix(s, "["):
		if !strings.HasSuffix(s, "]") {
			return nil, fmt.Errorf("line %d: unterminated flow sequence", no)
		}
		var out []any
		for _, part := range strings.Split(s[1:len(s)-1], ",") {
			v, err := scalar(strings.TrimSpace(part), no)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case strings.HasPrefix(s, "{"):
		return nil, fmt.Errorf("line %d: flow mappings are not supported", no)
	case strings.HasPrefix(s, "'"):
		if len(s) < 2 || !strings.HasSuffix(s, "'") {
			return nil, fmt.Errorf("line %d: unterminated quote", no)
		}
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'"), nil
	case strings.HasPrefix(s, `"`):
		if len(s) < 2 || !strings.HasSuffix(s, `"`) {
			return nil, fmt.Errorf("line %d: unterminated quote", no)
		}
		return s[1 : len(s)-1], nil
	case strings.Contains(s, " #"):
		return nil, fmt.Errorf("line %d: inline comments are not supported", no)
	}
	return s, nil
}

func loadSpec(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := parseYAML(string(b))
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	m, ok := doc.(map[string]any)
	if !ok {
		t.Fatal("openapi.yaml: top level is not a mapping")
	}
	return m
}

func mapAt(v any, keys ...string) map[string]any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	m, _ := v.(map[string]any)
	return m
}

var httpMethods = map[string]bool{"get": true, "put": true, "post": true, "delete": true, "patch": true, "head": true, "options": true}

// specRoutes lists "METHOD /path" for every operation of the spec.
func specRoutes(spec map[string]any) []string {
	var out []string
	for path, item := range mapAt(spec, "paths") {
		for method := range item.(map[string]any) {
			if httpMethods[method] {
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestSpecMatchesServerRoutes(t *testing.T) {
	spec := loadSpec(t)
	if v, _ := spec["openapi"].(string); !strings.HasPrefix(v, "3.0.") {
		t.Fatalf("openapi version %q", v)
	}
	// Routes omits /metrics, which the server mounts separately.
	want := append(apiserver.Routes(), "GET /metrics")
	for i, r := range want {
		want[i] = strings.ReplaceAll(r, "...}", "}") // {ref...} is {ref} in OpenAPI
	}
	sort.Strings(want)
	got := specRoutes(spec)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("spec and server disagree.\nonly in spec:   %v\nonly in server: %v", diff(got, want), diff(want, got))
	}
}

func diff(a, b []string) []string {
	in := map[string]bool{}
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
		}
	}
	return out
}

// walk calls fn for every mapping in v, with its location.
func walk(v any, where string, fn func(where string, m map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(where, x)
		for k, c := range x {
			walk(c, where+"/"+k, fn)
		}
	case []any:
		for i, c := range x {
			walk(c, fmt.Sprintf("%s[%d]", where, i), fn)
		}
	}
}

func resolve(spec map[string]any, ref string) map[string]any {
	parts := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
	return mapAt(spec, parts...)
}

func TestSpecRefsAndParameters(t *testing.T) {
	spec := loadSpec(t)
	walk(spec, "", func(where string, m map[string]any) {
		if ref, ok := m["$ref"].(string); ok {
			if !strings.HasPrefix(ref, "#/components/") || resolve(spec, ref) == nil {
				t.Errorf("%s: $ref %q does not resolve", where, ref)
			}
		}
	})
	for path, item := range mapAt(spec, "paths") {
		item := item.(map[string]any)
		for method, op := range item {
			if !httpMethods[method] {
				continue
			}
			op := op.(map[string]any)
			where := strings.ToUpper(method) + " " + path
			declared := map[string]bool{}
			for _, list := range []any{item["parameters"], op["parameters"]} {
				for _, p := range asList(list) {
					pm := p.(map[string]any)
					if ref, ok := pm["$ref"].(string); ok {
						pm = resolve(spec, ref)
					}
					if pm["in"] == "path" {
						if pm["required"] != "true" {
							t.Errorf("%s: path parameter %v must be required", where, pm["name"])
						}
						declared[pm["name"].(string)] = true
					}
				}
			}
			for _, seg := range strings.Split(path, "/") {
				if strings.HasPrefix(seg, "{") {
					name := strings.Trim(seg, "{}")
					if !declared[name] {
						t.Errorf("%s: path parameter %q is not declared", where, name)
					}
					delete(declared, name)
				}
			}
			if len(declared) > 0 {
				t.Errorf("%s: declares path parameters not in the path: %v", where, declared)
			}
			if op["operationId"] == nil || op["responses"] == nil {
				t.Errorf("%s: needs operationId and responses", where)
			}
			public := op["security"] != nil && len(asList(op["security"])) == 0
			if strings.HasPrefix(path, "/v1/") == public {
				t.Errorf("%s: /v1 routes need the bearer token, others are public (public=%v)", where, public)
			}
		}
	}
	if mapAt(spec, "components", "securitySchemes", "bearer")["scheme"] != "bearer" {
		t.Error("bearer security scheme missing")
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

// TestSchemasMatchTypes checks each schema against the JSON encoding of its
// Go type: the same property names, required = the fields without
// omitempty, and compatible types.
func TestSchemasMatchTypes(t *testing.T) {
	spec := loadSpec(t)
	types := map[string]any{
		"CreateSandboxRequest": api.CreateSandboxRequest{},
		"Sandbox":              api.Sandbox{},
		"SandboxList":          api.SandboxList{},
		"SnapshotList":         api.SnapshotList{},
		"Trajectory":           api.Trajectory{},
		"TrajectoryList":       api.TrajectoryList{},
		"ExecRequest":          api.ExecRequest{},
		"ExecResult":           api.ExecResult{},
		"ExecEvent":            api.ExecEvent{},
		"TermMessage":          api.TermMessage{},
		"ReplayRequest":        api.ReplayRequest{},
		"TrajectoryReplay":     api.TrajectoryReplay{},
		"StepDifference":       api.StepDifference{},
		"Command":              api.Command{},
		"CommandRecord":        api.CommandRecord{},
		"CommandHistory":       api.CommandHistory{},
		"SandboxStats":         api.SandboxStats{},
		"Port":                 api.Port{},
		"PortRequest":          api.PortRequest{},
		"FileInfo":             api.FileInfo{},
		"FileList":             api.FileList{},
		"MkdirRequest":         api.MkdirRequest{},
		"RenameRequest":        api.RenameRequest{},
		"Image":                api.Image{},
		"ImageList":            api.ImageList{},
		"PullImageRequest":     api.PullImageRequest{},
		"ImageConfig":          api.ImageConfig{},
		"CommitImageRequest":   api.CommitImageRequest{},
		"Layer":                api.Layer{},
		"LayerList":            api.LayerList{},
		"CreateLayerRequest":   api.CreateLayerRequest{},
		"GCResult":             api.GCResult{},
		"Node":                 api.Node{},
		"NodeList":             api.NodeList{},
		"NodePool":             api.NodePool{},
		"PauseRequest":         api.PauseRequest{},
		"PoolRequest":          api.PoolRequest{},
		"FnCallRequest":        api.FnCallRequest{},
		"Pool":                 api.Pool{},
		"PoolList":             api.PoolList{},
		"PauseResult":          api.PauseResult{},
		"NodeFeatures":         api.NodeFeatures{},
		"AuditRecord":          api.AuditRecord{},
		"AuditList":            api.AuditList{},
		"AuditStepSummary":     api.AuditStepSummary{},
		"Error":                api.Error{},
		"ErrorBody":            api.ErrorBody{},
		"Usage":                api.Usage{},
		"Event":                api.Event{},
		"EventList":            api.EventList{},
		"Quota":                api.Quota{},
		"Project":              api.Project{},
		"ProjectList":          api.ProjectList{},
		"CreateProjectRequest": api.CreateProjectRequest{},
		"UpdateProjectRequest": api.UpdateProjectRequest{},
		"CreateTokenRequest":   api.CreateTokenRequest{},
		"Token":                api.Token{},
		"TokenList":            api.TokenList{},
		"BatchCreateRequest":   api.BatchCreateRequest{},
		"BatchCreateResult":    api.BatchCreateResult{},
		"BatchError":           api.BatchError{},
		"NetworkRule":          api.NetworkRule{},
		"NetworkRuleList":      api.NetworkRuleList{},
		"NetworkDenials":       api.NetworkDenials{},
		"NetworkDenialRecord":  api.NetworkDenialRecord{},
	}
	for name, v := range types {
		schema := mapAt(spec, "components", "schemas", name)
		if schema == nil {
			t.Errorf("schema %s missing", name)
			continue
		}
		props := mapAt(schema, "properties")
		required := map[string]bool{}
		for _, r := range asList(schema["required"]) {
			required[r.(string)] = true
		}
		rt := reflect.TypeOf(v)
		seen := map[string]bool{}
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			tag := f.Tag.Get("json")
			jname, opts, _ := strings.Cut(tag, ",")
			if jname == "-" || !f.IsExported() {
				continue
			}
			seen[jname] = true
			prop := mapAt(props, jname)
			if prop == nil {
				t.Errorf("%s: property %q (field %s) missing from the spec", name, jname, f.Name)
				continue
			}
			omit := strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
			if required[jname] == omit {
				t.Errorf("%s.%s: required=%v but omitempty=%v", name, jname, required[jname], omit)
			}
			if ref, ok := prop["$ref"].(string); ok {
				prop = resolve(spec, ref)
			}
			if want := openapiType(f.Type); prop["type"] != want {
				t.Errorf("%s.%s: spec type %v, Go type %s wants %s", name, jname, prop["type"], f.Type, want)
			}
		}
		for p := range props {
			if !seen[p] {
				t.Errorf("%s: spec property %q has no Go field", name, p)
			}
		}
		for r := range required {
			if props[r] == nil {
				t.Errorf("%s: required %q is not a property", name, r)
			}
		}
	}
}

func openapiType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(time.Time{}) {
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return "?"
}

func TestErrorCodesAndStates(t *testing.T) {
	spec := loadSpec(t)
	enum := func(schema, prop string) []string {
		s := mapAt(spec, "components", "schemas", schema)
		if prop != "" {
			s = mapAt(s, "properties", prop)
		}
		var out []string
		for _, v := range asList(s["enum"]) {
			out = append(out, v.(string))
		}
		sort.Strings(out)
		return out
	}
	codes := []string{api.CodeBadRequest, api.CodeUnauthorized, api.CodeForbidden, api.CodeNotFound, api.CodeConflict,
		api.CodeTooLarge, api.CodeInvalid, api.CodeTooManyRequests, api.CodeInternal, api.CodeBadGateway, api.CodeUnavailable, api.CodeTimeout}
	sort.Strings(codes)
	if got := enum("Error", "code"); strings.Join(got, ",") != strings.Join(codes, ",") {
		t.Errorf("error codes in spec %v, in api %v", got, codes)
	}
	states := []string{api.StateCreating, api.StateRunning, api.StatePaused, api.StateStopped, api.StateFailed, api.StateLost}
	sort.Strings(states)
	if got := enum("SandboxState", ""); strings.Join(got, ",") != strings.Join(states, ",") {
		t.Errorf("states in spec %v, in api %v", got, states)
	}
	// The NDJSON variant of exec is documented.
	ok200 := mapAt(spec, "paths", "/v1/sandboxes/{id}/exec", "post", "responses", "200", "content")
	if ok200["application/x-ndjson"] == nil || ok200["application/json"] == nil {
		t.Error("exec 200 must document application/json and application/x-ndjson")
	}
}

func TestMiniYAMLParser(t *testing.T) {
	v, err := parseYAML("a: 1\nb:\n  - x\n  - k: v\n    j: 'q: r'\nc: [p, 'q']\nd: |\n  line1\n\n  line2\ne: {}\n")
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(v)
	want := "map[a:1 b:[x map[j:q: r k:v]] c:[p q] d:line1\n\nline2\n e:map[]]"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	for _, bad := range []string{"a: 1\n a: 2\n", "a: 1\na: 2\n", "a: [x\n", "a: b # c\n"} {
		if _, err := parseYAML(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
