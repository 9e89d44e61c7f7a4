package image

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// testRegistry is go-containerregistry's in-memory registry on loopback,
// counting blob downloads and optionally corrupting them.
type testRegistry struct {
	srv     *httptest.Server
	host    string
	mu      sync.Mutex
	gets    map[string]int // blob digest -> GETs
	corrupt atomic.Bool
}

func newTestRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{gets: map[string]int{}}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if i := strings.Index(req.URL.Path, "/blobs/sha256:"); i >= 0 && req.Method == http.MethodGet {
			r.mu.Lock()
			r.gets[req.URL.Path[i+7:]]++
			r.mu.Unlock()
			if r.corrupt.Load() {
				rec := httptest.NewRecorder()
				reg.ServeHTTP(rec, req)
				b := rec.Body.Bytes()
				if len(b) > 100 {
					b[len(b)/2] ^= 0xff
				}
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(b)
				return
			}
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

func (r *testRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// layerGets counts the GETs of img's layer blobs (configs are not layers).
func (r *testRegistry) layerGets(t *testing.T, img v1.Image) (total int, max int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		d, _ := l.Digest()
		n := r.gets[d.String()]
		total += n
		if n > max {
			max = n
		}
	}
	return
}

func TestPullFromRegistry(t *testing.T) {
	requireRoot(t)
	reg := newTestRegistry(t)
	img := testImage(t, "amd64")
	ref := reg.push(t, "test/img:1", img)
	s := newStore(t)
	ctx := context.Background()

	// Concurrent pulls of the same image: each layer is fetched once.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, err := s.Pull(ctx, ref, "pulled-"+string(rune('a'+i)))
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, max := reg.layerGets(t, img); max != 1 {
		t.Fatalf("a layer was fetched %d times by concurrent pulls", max)
	}
	got, dirs := mountImage(t, s, "pulled-a")
	checkTestImage(t, got, dirs)

	// Pinned by digest; a second pull fetches no layer.
	d, _ := img.Digest()
	before, _ := reg.layerGets(t, img)
	pinned := reg.host + "/test/img@" + d.String()
	p, err := s.Pull(ctx, pinned, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != pinned || p.Digest != got.Digest {
		t.Fatalf("pinned pull %+v", p)
	}
	if after, _ := reg.layerGets(t, img); after != before {
		t.Fatalf("layers fetched again: %d -> %d", before, after)
	}

	// Errors: unknown repo or digest, bad references, an unreachable
	// registry, corrupt blobs. Nothing is left behind.
	cases := []struct {
		ref  string
		want error
	}{
		{reg.host + "/nope:1", ErrNotFound},
		{reg.host + "/test/img@sha256:" + strings.Repeat("0", 64), ErrNotFound},
		{"UPPER/case:x", ErrInvalid},
		{"", ErrInvalid},
		{"127.0.0.1:1/x:y", ErrRegistry},
	}
	s2 := newStore(t)
	for _, c := range cases {
		if _, err := s2.Pull(ctx, c.ref, "x"); !errors.Is(err, c.want) {
			t.Errorf("%q: want %v, got %v", c.ref, c.want, err)
		}
	}
	reg.corrupt.Store(true)
	if _, err := s2.Pull(ctx, ref, "x"); err == nil {
		t.Fatal("corrupt blobs accepted")
	} else {
		t.Logf("corrupt: %v", err)
	}
	if l, i, tmp := visible(t, s2); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left behind: %v %v %v", l, i, tmp)
	}
}
