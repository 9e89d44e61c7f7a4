package cpugate

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLevels(t *testing.T) {
	for _, c := range []struct {
		full, idle float64
		v2         bool
		idleQ, fq  string
	}{
		{1, 0.05, false, "5000", "100000"},
		{1, 0, false, "1000", "100000"},     // the kernel's minimum
		{0, 0.02, false, "2000", "-1"},      // full 0: unlimited
		{0.005, 0.5, false, "1000", "1000"}, // idle never above full, neither below the minimum
		{2, 0.05, true, "5000 100000", "200000 100000"},
		{0, 0.1, true, "10000 100000", "max 100000"},
	} {
		l := Levels(c.full, c.idle, c.v2)
		if string(l[0]) != c.idleQ || string(l[1]) != c.fq {
			t.Errorf("Levels(%g, %g, v2 %v) = %q, %q; want %q, %q", c.full, c.idle, c.v2, l[0], l[1], c.idleQ, c.fq)
		}
	}
}

// TestGateFiles: Set writes the levels (the quota before the thaw, the
// freeze before the quota) and Sample reads v1's and v2's usage and
// throttled time; on plain files standing in for a cgroup's.
func TestGateFiles(t *testing.T) {
	dir := t.TempDir()
	p := func(n, v string) string {
		f := filepath.Join(dir, n)
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	read := func(f string) string {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	files := Files{Quota: p("quota", "-1"), Stat: p("stat", "nr_periods 5\nthrottled_time 700\n"), Usage: p("usage", "12345\n"),
		Freeze: p("freeze", "0"), FreezeV2: true}
	g, err := Open(files, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Set(false); err != nil {
		t.Fatal(err)
	}
	if q, f := read(files.Quota), read(files.Freeze); q != "1000" || f != "1" {
		t.Errorf("idle: quota %q, freeze %q", q, f)
	}
	if err := g.Set(true); err != nil {
		t.Fatal(err)
	}
	if q, f := read(files.Quota), read(files.Freeze); q != "100000" || f != "0" {
		t.Errorf("full: quota %q, freeze %q", q, f)
	}
	if u, th, err := g.Sample(); err != nil || u != 12345 || th != 700 {
		t.Errorf("v1 sample: %d %d %v", u, th, err)
	}
	v2 := Files{Quota: p("cpu.max", "max 100000"), Stat: p("cpu.stat", "usage_usec 42\nuser_usec 40\nthrottled_usec 3\n"), V2: true}
	g2, err := Open(v2, 0.5, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if err := g2.Set(false); err != nil {
		t.Fatal(err)
	}
	if q := read(v2.Quota); q != "5000 100000" {
		t.Errorf("v2 idle quota %q", q)
	}
	if u, th, err := g2.Sample(); err != nil || u != 42000 || th != 3000 {
		t.Errorf("v2 sample: %d %d %v", u, th, err)
	}
	if _, err := Open(Files{Quota: filepath.Join(dir, "gone", "cpu.max")}, 1, 0); !os.IsNotExist(err) {
		t.Errorf("a gone cgroup: %v, want not exist", err)
	}
}
