package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestNamedLayerDigestIsOfContent: two tar writers that pack one tree
// differently (entry order, root entry, PAX records with sub-second times
// and user names, USTAR) give one layer digest, and a changed file another.
func TestNamedLayerDigestIsOfContent(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 987_654_321)
	type ent struct {
		name, body, link string
		typ              byte
		mode             int64
	}
	ents := []ent{
		{name: "pkg/", typ: tar.TypeDir, mode: 0o755},
		{name: "pkg/a.py", body: "print(1)\n", typ: tar.TypeReg, mode: 0o644},
		{name: "pkg/run", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o755},
		{name: "pkg/l", link: "a.py", typ: tar.TypeSymlink, mode: 0o777},
	}
	pack := func(pax, reversed bool, edit string) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if pax {
			tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Now(), Format: tar.FormatPAX})
		}
		order := append([]ent(nil), ents...)
		if reversed { // parents after children: unpack makes them first
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, e := range order {
			body := e.body
			if e.name == "pkg/a.py" && edit != "" {
				body = edit
			}
			h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(body)), ModTime: at}
			if pax {
				h.Format, h.Uname, h.Gname = tar.FormatPAX, "someone", "staff"
			} else {
				h.Format, h.ModTime = tar.FormatUSTAR, at.Truncate(time.Second)
			}
			if e.typ != tar.TypeReg {
				h.Size = 0
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if e.typ == tar.TypeReg {
				tw.Write([]byte(body))
			}
		}
		tw.Close()
		p := filepath.Join(t.TempDir(), "l.tar")
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	l1, err := s.CreateLayerFromTar(ctx, "ws/calc", 0, pack(false, false, ""))
	if err != nil {
		t.Fatal(err)
	}
	l2, err := s.CreateLayerFromTar(ctx, "ws/calc", 1, pack(true, true, ""))
	if err != nil || l2.Digest != l1.Digest {
		t.Fatalf("same tree, other writer: %+v %v, want %s", l2, err, l1.Digest)
	}
	l3, err := s.CreateLayerFromTar(ctx, "ws/calc", 0, pack(true, false, ""))
	if err != nil || l3.Version != 1 {
		t.Fatalf("unchanged content without a version: %+v %v, want version 1", l3, err)
	}
	l4, err := s.CreateLayerFromTar(ctx, "ws/calc", 0, pack(false, false, "print(2)\n"))
	if err != nil || l4.Version != 2 || l4.Digest == l1.Digest {
		t.Fatalf("changed content: %+v %v", l4, err)
	}
}
