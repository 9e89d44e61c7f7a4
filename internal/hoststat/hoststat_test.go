package hoststat

import (
	"os"
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
