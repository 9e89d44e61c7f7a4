package apiserver

import (
	"testing"
	"unicode/utf8"
)

func TestCompleteUTF8(t *testing.T) {
	s := []byte("aé€😀")
	for cut := 0; cut <= len(s); cut++ {
		head := s[:cut]
		n := completeUTF8(head)
		if !utf8.Valid(head[:n]) {
			t.Errorf("cut %d: prefix %q is not valid UTF-8", cut, head[:n])
		}
		if rest := head[n:]; len(rest) > 3 {
			t.Errorf("cut %d: held back %d bytes", cut, len(rest))
		}
		if utf8.Valid(head) && n != len(head) {
			t.Errorf("cut %d: held back bytes of a complete string", cut)
		}
	}
	// Invalid bytes are not held back forever.
	if n := completeUTF8([]byte{0xff, 0xfe, 0x80, 0x80}); n != 4 {
		t.Errorf("invalid input held back: %d", n)
	}
}

func FuzzCompleteUTF8(f *testing.F) {
	f.Add([]byte("héllo"))
	f.Add([]byte{0xe2, 0x82})
	f.Fuzz(func(t *testing.T, b []byte) {
		n := completeUTF8(b)
		if n < 0 || n > len(b) || len(b)-n > 3 {
			t.Fatalf("bad cut %d of %d", n, len(b))
		}
		if utf8.Valid(b) && n != len(b) {
			t.Fatalf("valid input cut at %d of %d", n, len(b))
		}
	})
}
