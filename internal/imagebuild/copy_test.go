package imagebuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
)

func context_(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func names(p *copyPlan) string {
	var out []string
	for _, e := range p.entries {
		out = append(out, e.name)
	}
	return strings.Join(out, ",")
}

func TestPlanCopy(t *testing.T) {
	dir := context_(t, map[string]string{
		"a.txt": "a", "b.txt": "b", "src/x.go": "x", "src/sub/y.go": "y", "src/skip.log": "l",
		"secret/key": "k", ".dockerignore": "secret\n**/*.log\n", "app.tar": "not really a tar",
	})
	b := &builder{o: Options{Context: dir}}
	b.st.Workdir = "/app"
	plan := func(dest string, src ...string) (*copyPlan, error) {
		return b.planCopy("COPY", instructions.SourcesAndDest{SourcePaths: src, DestPath: dest}, "", false)
	}
	for _, tc := range []struct {
		dest    string
		src     []string
		dir     string
		entries string
	}{
		{"/etc/a.conf", []string{"a.txt"}, "/etc", "a.conf"},
		{"/etc/", []string{"a.txt"}, "/etc", "a.txt"},
		{"rel/", []string{"*.txt"}, "/app/rel", "a.txt,b.txt"},
		{".", []string{"a.txt"}, "/app", "a.txt"},
		{"/s", []string{"src"}, "/s", "sub,sub/y.go,x.go"},
		{"/all/", []string{"."}, "/all", ".dockerignore,a.txt,app.tar,b.txt,src,src/sub,src/sub/y.go,src/x.go"},
	} {
		p, err := plan(tc.dest, tc.src...)
		if err != nil {
			t.Errorf("COPY %v %s: %v", tc.src, tc.dest, err)
			continue
		}
		if p.dir != tc.dir || names(p) != tc.entries {
			t.Errorf("COPY %v %s: into %s: %s; want %s: %s", tc.src, tc.dest, p.dir, names(p), tc.dir, tc.entries)
		}
	}
	for _, tc := range []struct {
		dest string
		src  []string
		want string
	}{
		{"/x", []string{"missing"}, "no such file"},
		{"/x", []string{"secret/key"}, "no such file"}, // .dockerignore
		{"/x", []string{"a.txt", "b.txt"}, "must end with /"},
		{"/x", []string{"https://example.com/f"}, "not a path"},
	} {
		if _, err := plan(tc.dest, tc.src...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("COPY %v %s: %v, want %q", tc.src, tc.dest, err, tc.want)
		}
	}
	if _, err := b.planCopy("ADD", instructions.SourcesAndDest{SourcePaths: []string{"https://example.com/f.tar"}, DestPath: "/x"}, "", true); err == nil ||
		!strings.Contains(err.Error(), "remote URLs are not supported") {
		t.Errorf("ADD URL: %v", err)
	}
	if _, err := b.planCopy("COPY", instructions.SourcesAndDest{SourcePaths: []string{"a.txt"}, DestPath: "/x"}, "u+x", false); err == nil {
		t.Error("symbolic --chmod accepted")
	}
	// Escaping the context: ".." is cleaned away, a symlink out is refused.
	if p, err := plan("/x/", "../../a.txt"); err != nil || names(p) != "a.txt" {
		t.Errorf("COPY ../../a.txt: %v %v", p, err)
	}
	os.Symlink("/etc/passwd", filepath.Join(dir, "out"))
	if _, err := plan("/x", "out"); err == nil || !strings.Contains(err.Error(), "out of the build context") {
		t.Errorf("symlink out of the context: %v", err)
	}
}

func TestCopyDigest(t *testing.T) {
	dir := context_(t, map[string]string{"a.txt": "one", "d/b.txt": "two"})
	b := &builder{o: Options{Context: dir}}
	digest := func() string {
		p, err := b.planCopy("COPY", instructions.SourcesAndDest{SourcePaths: []string{"a.txt", "d"}, DestPath: "/x/"}, "", false)
		if err != nil {
			t.Fatal(err)
		}
		d, err := p.digest("")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := digest()
	// A new mtime alone keeps the digest; new content, a new mode or a new
	// file change it.
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(dir, "a.txt"), later, later)
	if d := digest(); d != d1 {
		t.Error("the digest depends on mtimes")
	}
	os.WriteFile(filepath.Join(dir, "d/b.txt"), []byte("TWO"), 0o644)
	d2 := digest()
	if d2 == d1 {
		t.Error("changed content, same digest")
	}
	os.Chmod(filepath.Join(dir, "a.txt"), 0o755)
	d3 := digest()
	if d3 == d2 {
		t.Error("changed mode, same digest")
	}
	os.WriteFile(filepath.Join(dir, "d/c.txt"), []byte("new"), 0o644)
	if d := digest(); d == d3 {
		t.Error("new file, same digest")
	}
}
