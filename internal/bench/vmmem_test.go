package bench

import (
	"strings"
	"testing"
)

// TestParseSmaps: an idle QEMU's smaps is split into guest RAM (the
// anonymous mapping of the guest's size), TCG's code buffer (the one of its
// size, less a guard page), file mappings and the rest.
func TestParseSmaps(t *testing.T) {
	smaps := `55a190655000-55a190bec000 r-xp 00001000 fe:01 123 /usr/bin/qemu-system-x86_64
Rss:                5240 kB
Pss:                1000 kB
KSM:                   0 kB
55a1c78b2000-55a1c83c7000 rw-p 00000000 00:00 0                          [heap]
Rss:                5092 kB
Pss:                5092 kB
7f3d37e00000-7f3d47e00000 rw-p 00000000 00:00 0 
Rss:              101960 kB
Pss:               90000 kB
KSM:               20000 kB
7f3d50000000-7f3d51fff000 rwxp 00000000 00:00 0 
Rss:               32000 kB
Pss:               32000 kB
7f3d4c000000-7f3d4c759000 rw-p 00000000 00:00 0 
Rss:                7500 kB
Pss:                7500 kB
`
	p, err := parseSmaps(strings.NewReader(smaps), "TCG")
	if err != nil {
		t.Fatal(err)
	}
	want := vmParts{rss: 5240 + 5092 + 101960 + 32000 + 7500, pss: 1000 + 5092 + 90000 + 32000 + 7500,
		guest: 90000, tcg: 32000, qemu: 5092 + 7500, files: 1000, guestRSS: 101960, tcgRSS: 32000, ksmRSS: 20000}
	if p != want {
		t.Errorf("got %+v\nwant %+v", p, want)
	}
	// Under KVM there is no code buffer: a mapping of its size is QEMU's.
	p, _ = parseSmaps(strings.NewReader(smaps), "KVM")
	if p.tcg != 0 || p.qemu != 5092+7500+32000 {
		t.Errorf("kvm: %+v", p)
	}
}
