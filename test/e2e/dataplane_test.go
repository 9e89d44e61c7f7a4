package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// slowReader reads r at about rate bytes per second.
func slowRead(r io.Reader, rate int) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	start := time.Now()
	for {
		k, err := r.Read(buf)
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if ahead := time.Duration(float64(n)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
			time.Sleep(ahead)
		}
	}
}

// get sends an authenticated GET (or POST with body) and returns the response.
func (s *server) open(t *testing.T, ctx context.Context, method, path string, body []byte, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A download read slowly arrives whole, or the client sees an error: never
// a short 200 (issue 15: 320 MB of a 512 MiB file came back as a 200).
func TestSlowDownloadWholeOrFails(t *testing.T) {
	s := sharedServer(t)
	sb := s.create(t, api.CreateSandboxRequest{MemoryMB: 256})
	const size = 256 << 20
	if r := s.sh(t, sb.ID, fmt.Sprintf("head -c %d /dev/zero > /big && wc -c < /big", size)); strings.TrimSpace(r.Stdout) != fmt.Sprint(size) {
		t.Fatalf("write the file: %+v", r)
	}
	t.Cleanup(func() { s.sh(t, sb.ID, "rm -f /big") })
	for _, tc := range []struct{ name, path string }{
		{"file", "/v1/sandboxes/" + sb.ID + "/files?path=/big"},
		{"archive", "/v1/sandboxes/" + sb.ID + "/archive?path=/big"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.open(t, context.Background(), "GET", tc.path, nil, nil)
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			start := time.Now()
			n, err := slowRead(resp.Body, 24<<20)
			t.Logf("%s: %d bytes in %v, err %v", tc.name, n, time.Since(start).Round(time.Millisecond), err)
			want := int64(size)
			if tc.name == "archive" {
				want += 512 // at least one header
			}
			if err == nil && n < want {
				t.Fatalf("a short 200: %d of %d bytes and no error", n, want)
			}
			if err != nil {
				t.Errorf("the slow reader got an error (allowed, but the data plane should carry it whole): %v", err)
			}
		})
	}
}

// A long NDJSON exec stream read slowly arrives whole (its exit event
// last), or the client sees an error.
func TestSlowExecStreamWholeOrFails(t *testing.T) {
	s := sharedServer(t)
	sb := s.create(t, api.CreateSandboxRequest{})
	const size = 96 << 20
	body, _ := json.Marshal(api.ExecRequest{Cmd: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a", size), OutputCap: size})
	resp := s.open(t, context.Background(), "POST", "/v1/sandboxes/"+sb.ID+"/exec", body, map[string]string{"Accept": "application/x-ndjson"})
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := slowRead(io.TeeReader(resp.Body, pw), 16<<20)
		pw.CloseWithError(err)
	}()
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var got int64
	var last api.ExecEvent
	for sc.Scan() {
		var ev api.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("bad line: %v", err)
		}
		if ev.Stdout != nil {
			got += int64(len(*ev.Stdout))
		}
		last = ev
	}
	err := sc.Err()
	t.Logf("%d bytes of stdout, last event %+v, err %v", got, last, err)
	if err == nil && last.Error != nil {
		err = last.Error
	}
	if err == nil && (last.ExitCode == nil || got != size) {
		t.Fatalf("a short stream without error: %d of %d bytes, last event %+v", got, size, last)
	}
	if err != nil {
		t.Errorf("the slow reader got an error (allowed, but the data plane should carry it whole): %v", err)
	}
}

// sleepers counts the processes running `sleep 600` in the sandbox.
func sleepers(t *testing.T, s *server, id string) string {
	r := s.sh(t, id, "ps -o args | grep -c '^sleep 600' || true")
	return strings.TrimSpace(r.Stdout)
}

// A client that goes away cancels its command: `sleep 600` is gone within
// a second, for a streamed and a plain exec.
func TestClientDisconnectKillsCommand(t *testing.T) {
	s := sharedServer(t)
	sb := s.create(t, api.CreateSandboxRequest{})
	for _, accept := range []string{"application/x-ndjson", "application/json"} {
		t.Run(strings.TrimPrefix(accept, "application/"), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			body, _ := json.Marshal(api.ExecRequest{Cmd: "sleep 600"})
			done := make(chan struct{})
			go func() {
				defer close(done)
				req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/v1/sandboxes/"+sb.ID+"/exec", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+s.Token)
				req.Header.Set("Accept", accept)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			deadline := time.Now().Add(10 * time.Second)
			for sleepers(t, s, sb.ID) != "1" {
				if time.Now().After(deadline) {
					t.Fatal("sleep 600 did not start")
				}
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
			<-done
			gone := time.Now()
			for sleepers(t, s, sb.ID) != "0" {
				if time.Since(gone) > 5*time.Second {
					t.Fatalf("sleep 600 still runs %v after its client went away", time.Since(gone))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if d := time.Since(gone); d > time.Second {
				t.Errorf("sleep 600 ran %v after its client went away (want < 1s)", d)
			}
		})
	}
}

// A download whose transfer breaks after the 200 (the edge killed) ends in
// an error the client sees, not a clean end of body.
func TestBrokenDownloadFailsLoudly(t *testing.T) {
	s := startServer(t)
	sb := s.create(t, api.CreateSandboxRequest{})
	const size = 128 << 20
	s.sh(t, sb.ID, fmt.Sprintf("head -c %d /dev/zero > /big", size))
	resp := s.open(t, context.Background(), "GET", "/v1/sandboxes/"+sb.ID+"/files?"+url.Values{"path": {"/big"}}.Encode(), nil, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Read a little, then stop the sandbox under the transfer.
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.Delete(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	n += 1 << 20
	t.Logf("%d bytes, err %v", n, err)
	if err == nil && n < size {
		t.Fatalf("a short 200: %d of %d bytes and no error", n, size)
	}
}

// A call to a sandbox whose node is gone (its edge killed -9) answers
// within 2 s, not after the bus's 20 s silence timeout.
func TestDeadNodeAnswersFast(t *testing.T) {
	c := startCluster(t, "ea", "eb")
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			c.dump()
		}
	}()
	sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
		NodeSelector: map[string]string{"zone": "ea"}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo hi > /f; cat /f"}); err != nil || r.Stdout != "hi\n" {
		t.Fatalf("exec: %+v %v", r, err)
	}

	// An apiserver killed in the middle of a download: its client sees an
	// error, not a short 200.
	if r, err := c.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "head -c 67108864 /dev/zero > /big"}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", r, err)
	}
	req, _ := http.NewRequest("GET", c.apiURL[1]+"/v1/sandboxes/"+sb.ID+"/files?path=/big", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("download: %v %v", resp, err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	c.api[1].kill9()
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	t.Logf("download from a killed apiserver: %d more bytes, err %v", n, err)
	if err == nil {
		t.Fatalf("a download from an apiserver killed mid-transfer ended without error after %d of 64 MiB", n+1<<20)
	}
	c.apiURL = c.apiURL[:1]
	// Calls in flight when the node dies: an exec (data plane) and a wait
	// for a background command (bus).
	bg, err := c.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "sleep 60", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	raw := &http.Client{}
	type answer struct {
		what   string
		status int
		at     time.Time
	}
	inflight := make(chan answer, 2)
	for _, call := range []struct{ what, method, path, body string }{
		{"exec sleep 60", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"sleep 60"}`},
		{"wait for a command", "GET", "/v1/sandboxes/" + sb.ID + "/commands/" + bg.CommandID + "?wait=1", ""},
	} {
		go func() {
			req, _ := http.NewRequest(call.method, c.apiURL[0]+call.path, strings.NewReader(call.body))
			req.Header.Set("Authorization", "Bearer "+c.token)
			status := 0
			if resp, err := raw.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			inflight <- answer{call.what, status, time.Now()}
		}()
	}
	time.Sleep(time.Second)
	c.edges["ea"].kill9()
	killed := time.Now()
	for range 2 {
		select {
		case a := <-inflight:
			took := a.at.Sub(killed)
			t.Logf("in flight: %s -> %d %v after the kill", a.what, a.status, took.Round(time.Millisecond))
			if took > 2*time.Second || a.status == 200 || a.status == 500 {
				t.Errorf("in flight: %s answered %d %v after its node died (want a 503 within 2s)", a.what, a.status, took)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a call in flight to a dead node has not answered in 30s")
		}
	}
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + sb.ID, ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"true"}`},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/f", ""},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/&list=1", ""},
	} {
		for i, u := range c.apiURL {
			req, _ := http.NewRequest(tc.method, u+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+c.token)
			start := time.Now()
			resp, err := raw.Do(req)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("apiserver %d: %s %s -> %d in %v: %s", i, tc.method, tc.path, resp.StatusCode, took.Round(time.Millisecond), strings.TrimSpace(string(b)))
			if took > 2*time.Second {
				t.Errorf("%s %s to a dead node took %v (want < 2s)", tc.method, tc.path, took)
			}
			if resp.StatusCode == 200 && tc.method != "GET" {
				t.Errorf("%s %s to a dead node answered 200", tc.method, tc.path)
			}
		}
	}
}

// An upload whose client goes away leaves nothing behind: no temporary
// file of a file upload.
func TestCancelledUploadLeavesNothing(t *testing.T) {
	s := sharedServer(t)
	sb := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, sb.ID, "mkdir -p /up")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "PUT", s.URL+"/v1/sandboxes/"+sb.ID+"/files?path=/up/f", pr)
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.ContentLength = 64 << 20
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	chunk := make([]byte, 1<<20)
	for i := 0; i < 16; i++ {
		if _, err := pw.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.sh(t, sb.ID, "ls -a /up").Stdout, ".warren-upload-") {
		if time.Now().After(deadline) {
			t.Fatal("the upload did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	pw.CloseWithError(context.Canceled)
	<-done
	gone := time.Now()
	for {
		out := s.sh(t, sb.ID, "ls -a /up").Stdout
		if !strings.Contains(out, ".warren-upload-") && !strings.Contains(out, "f\n") {
			break
		}
		if time.Since(gone) > 3*time.Second {
			t.Fatalf("3s after the client went away, the upload left %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Large uploads (past the single-write size) arrive whole through the data
// plane, in a plain sandbox and, recorded chunk by chunk, in a trajectory
// sandbox.
func TestLargeUploadWhole(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	data := make([]byte, 21<<20+12345)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	for _, traj := range []string{"", fmt.Sprintf("dp/upload-%d", time.Now().UnixNano())} {
		sb := s.create(t, api.CreateSandboxRequest{Trajectory: traj})
		fi, err := s.C.WriteFileBytes(ctx, sb.ID, "/d/up.bin", data, 0o600)
		if err != nil || fi.Size != int64(len(data)) || fi.Mode&0o777 != 0o600 {
			t.Fatalf("trajectory %q: upload: %+v %v", traj, fi, err)
		}
		got, err := s.C.ReadFileBytes(ctx, sb.ID, "/d/up.bin")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("trajectory %q: read back %d bytes (want %d), equal %v, %v", traj, len(got), len(data), bytes.Equal(got, data), err)
		}
		if r := s.sh(t, sb.ID, "ls -a /d"); r.Stdout != ".\n..\nup.bin\n" {
			t.Fatalf("trajectory %q: /d holds %q", traj, r.Stdout)
		}
		if traj != "" {
			steps, err := s.C.TrajectoryAll(ctx, traj)
			if err != nil {
				t.Fatal(err)
			}
			var ops []string
			for _, st := range steps {
				ops = append(ops, st.Op)
			}
			if len(ops) < 4 || ops[0] != "write" || ops[len(ops)-2] != "rename" || ops[len(ops)-1] != "exec" {
				t.Fatalf("trajectory steps: %v", ops)
			}
		}
	}
}

// A large archive streams in whole over the data plane.
func TestLargeArchiveUploadWhole(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	big := make([]byte, 9<<20+77)
	for i := range big {
		big[i] = byte(i*13 + i>>9)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, f := range []struct {
		name string
		data []byte
	}{{"big.bin", big}, {"a/small.txt", []byte("small\n")}, {"a/b/c.txt", []byte("c\n")}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(int64(i), 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := s.C.UploadArchive(ctx, sb.ID, "/arc", &buf)
	if err != nil || n != 3 {
		t.Fatalf("upload archive: %d %v", n, err)
	}
	got, err := s.C.ReadFileBytes(ctx, sb.ID, "/arc/big.bin")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big.bin: %d bytes (want %d), %v", len(got), len(big), err)
	}
	if r := s.sh(t, sb.ID, "cat /arc/a/small.txt /arc/a/b/c.txt"); r.Stdout != "small\nc\n" {
		t.Fatalf("small files: %q", r.Stdout)
	}
}

// An archive upload whose client goes away extracts nothing, even when the
// stream broke right after a whole entry (where a tar reader would see a
// clean end).
func TestBrokenArchiveUploadExtractsNothing(t *testing.T) {
	s := sharedServer(t)
	sb := s.create(t, api.CreateSandboxRequest{})
	var first bytes.Buffer
	tw := tar.NewWriter(&first)
	data := bytes.Repeat([]byte("x"), 6<<20) // past the first 4 MiB piece
	if err := tw.WriteHeader(&tar.Header{Name: "one.bin", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err != nil { // the entry, padded; no end-of-archive marker
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "PUT", s.URL+"/v1/sandboxes/"+sb.ID+"/archive?path=/arc", pr)
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.ContentLength = int64(first.Len()) + 64<<20
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := pw.Write(first.Bytes()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the entry is through
	cancel()
	pw.CloseWithError(context.Canceled)
	<-done
	time.Sleep(time.Second)
	if r := s.sh(t, sb.ID, "ls -a /arc 2>&1; true"); strings.Contains(r.Stdout, "one.bin") {
		t.Fatalf("a broken archive upload left %q", r.Stdout)
	}
}
