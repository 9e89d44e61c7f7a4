package hoststat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseMeminfo(t *testing.T) {
	m := parseMeminfo([]byte("MemTotal:       24684128 kB\nMemFree:        1 kB\nMemAvailable:   2048 kB\nSwapTotal:      1024 kB\nSwapFree:        256 kB\nHugePages_Total:       0\n"))
	if m.Total != 24684128<<10 || m.Available != 2048<<10 || m.SwapTotal != 1024<<10 || m.SwapUsed() != 768<<10 {
		t.Fatalf("parsed %+v", m)
	}
}

func TestParsePressure(t *testing.T) {
	p := parsePressure([]byte("some avg10=1.50 avg60=0.25 avg300=0.00 total=149357\nfull avg10=9.00 avg60=0.00 avg300=0.00 total=82691\n"))
	if p.Avg10 != 1.5 || p.Avg60 != 0.25 || p.Avg300 != 0 {
		t.Fatalf("parsed %+v", p)
	}
}

func TestParseLoadavgTasks(t *testing.T) {
	tk, err := parseLoadavgTasks([]byte("0.61 0.60 1.29 3/25181 12345\n"))
	if err != nil || tk.Used != 25181 {
		t.Fatalf("parsed %+v, %v", tk, err)
	}
	for _, bad := range []string{"", "0.1 0.2 0.3", "0.1 0.2 0.3 12 1", "0.1 0.2 0.3 1/x 1"} {
		if _, err := parseLoadavgTasks([]byte(bad)); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
	tk, err = ReadTasks()
	if err != nil || tk.Used <= 0 || tk.Limit < tk.Used {
		t.Fatalf("implausible tasks %+v, %v", tk, err)
	}
}

func TestReadHost(t *testing.T) {
	m, err := ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	if m.Total <= 0 || m.Available <= 0 || m.Available > m.Total {
		t.Fatalf("implausible meminfo %+v", m)
	}
	if _, err := os.Stat("/proc/pressure/memory"); err == nil {
		if _, err := ReadPressure("memory"); err != nil {
			t.Fatal(err)
		}
	} else if _, err := ReadPressure("memory"); err != ErrNoPSI {
		t.Fatalf("want ErrNoPSI, got %v", err)
	}
	f := Features()
	t.Logf("features: %+v", f)
	if !f.SchedIdle {
		t.Fatal("SCHED_IDLE must be reported")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("MemTotal: 1 kB\nsome avg10=1 x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = parseMeminfo(b)
		_ = parsePressure(b)
	})
}

func TestRaiseSharedLimits(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("fs/inotify/max_user_instances", "128\n")
	write("fs/inotify/max_user_watches", "99999999\n") // higher already: kept
	changed, err := RaiseSharedLimits(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 1 || !strings.HasPrefix(changed[0], "fs.inotify.max_user_instances: 128 → ") {
		t.Fatalf("changed %v", changed)
	}
	for name, want := range map[string]string{"fs/inotify/max_user_instances": "1048576", "fs/inotify/max_user_watches": "99999999\n"} {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	// A missing sysctl (kernel without inotify) is skipped; a bad one is an error.
	if changed, err := RaiseSharedLimits(t.TempDir()); err != nil || len(changed) != 0 {
		t.Errorf("empty dir: %v %v", changed, err)
	}
	write("fs/inotify/max_user_instances", "x")
	if _, err := RaiseSharedLimits(dir); err == nil {
		t.Error("a malformed value was accepted")
	}
}
