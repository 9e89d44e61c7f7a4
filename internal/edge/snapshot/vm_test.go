package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
)

// tarOf is an upper.tar as a guest agent streams it: files by path, owned
// by the test's user (the unpacker sets owners: no root needed).
func tarOf(t *testing.T, files map[string]string, mtime time.Time) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range []string{"a", "c", "d/", "d/b", "../escape"} {
		data, ok := files[name]
		if !ok {
			continue
		}
		h := &tar.Header{Name: name, Uid: os.Getuid(), Gid: os.Getgid(), Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			h.Mode, h.Size, h.Typeflag = 0o755, 0, tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// fakeAgent is a guest agent that answers each OpUpperTar with the next of
// answers (a tar, or an error when fail is set), reading and dropping
// every other frame the edge sends (credits, cancels).
type fakeAgent struct {
	mu      sync.Mutex
	answers [][]byte
	fail    *agentproto.Error
}

func (f *fakeAgent) client(t *testing.T) *agentproto.Client {
	a, b := net.Pipe()
	c := agentproto.NewClient(a)
	var wmu sync.Mutex
	var wg sync.WaitGroup
	go func() {
		defer b.Close()
		for {
			var req agentproto.Request
			if err := agentproto.ReadRequest(b, &req); err != nil {
				return
			}
			if req.Op != agentproto.OpUpperTar {
				continue
			}
			f.mu.Lock()
			var data []byte
			if len(f.answers) > 0 {
				data, f.answers = f.answers[0], f.answers[1:]
			}
			f.mu.Unlock()
			wg.Add(1)
			go func(id uint64) { // writes while the loop reads the credits
				defer wg.Done()
				wmu.Lock()
				defer wmu.Unlock()
				if f.fail != nil {
					_ = agentproto.WriteFrame(b, &agentproto.Response{ID: id, Kind: agentproto.KindError, Error: f.fail})
					return
				}
				for len(data) > 0 {
					n := min(len(data), 4<<10)
					if agentproto.WriteChunk(b, id, agentproto.StreamData, data[:n]) != nil {
						return
					}
					data = data[n:]
				}
				body, _ := json.Marshal(agentproto.UpperTarResult{FrozenMs: 12})
				_ = agentproto.WriteFrame(b, &agentproto.Response{ID: id, Kind: agentproto.KindDone, Body: body})
			}(req.ID)
		}
	}()
	t.Cleanup(func() {
		_ = c.Close()
		wg.Wait()
	})
	return c
}

func vmRig(t *testing.T, ag *fakeAgent) *rig {
	r := newRig(t)
	r.sb.src.Spec.Tier = api.TierMicroVM
	r.sb.src.Spec.DiskMB = 64
	r.sb.src.Agent = ag.client(t)
	return r
}

// TestTakeVM: a VM's snapshot is the guest's upper.tar unpacked beside its
// writable layer (the host freezes nothing: the guest froze its disk), and
// the next one is incremental against it as a container's.
func TestTakeVM(t *testing.T) {
	ctx := context.Background()
	mt := time.Unix(1700000000, 0)
	ag := &fakeAgent{answers: [][]byte{
		tarOf(t, map[string]string{"a": "1", "d/": "", "d/b": "1"}, mt),
		tarOf(t, map[string]string{"a": "1", "c": "1", "d/": "", "d/b": "22"}, mt),
	}}
	r := vmRig(t, ag)
	first, err := r.s.Take(ctx, r.sb, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.layers.packed["snap/"+first.ID], ","); got != "a,d/b" || first.FrozenMs != 12 {
		t.Fatalf("first VM snapshot packed %q frozen %v ms, want a,d/b and the guest's 12 ms", got, first.FrozenMs)
	}
	second, err := r.s.Take(ctx, r.sb, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.layers.packed["snap/"+second.ID], ","); got != "c,d/b" || second.Previous != first.ID {
		t.Fatalf("second VM snapshot packed %q previous %q, want c,d/b on %s", got, second.Previous, first.ID)
	}
	if r.rt.freezes != 0 {
		t.Fatalf("the host froze a VM %d times", r.rt.freezes)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(r.upper), ".snapshot-*"))
	if len(left) != 0 {
		t.Fatalf("copies left behind: %v", left)
	}
}

// TestTakeVMRefusals: a stream the unpacker refuses (a path out of the
// copy) and an agent that cannot pack its disk are conflicts naming why;
// nothing is recorded and nothing is written outside the copy.
func TestTakeVMRefusals(t *testing.T) {
	ctx := context.Background()
	r := vmRig(t, &fakeAgent{answers: [][]byte{tarOf(t, map[string]string{"a": "1", "../escape": "x"}, time.Now())}})
	_, err := r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeConflict, "cannot be packed")
	if _, err := os.Lstat(filepath.Join(filepath.Dir(r.upper), "escape")); err == nil {
		t.Fatal("the guest's tar wrote outside the copy")
	}
	if len(r.store.recs) != 0 {
		t.Fatal("a refused VM snapshot was recorded")
	}
	r = vmRig(t, &fakeAgent{fail: &agentproto.Error{Code: agentproto.ErrInvalid, Message: "no writable disk"}})
	_, err = r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeConflict, "n1-sb1", "no writable disk")
}
