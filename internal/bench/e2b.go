package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// E2B figure sizes: creates, commands.run('true') and 1 MiB write+read
// round trips timed through each front.
const (
	e2bCreates = 30
	e2bRuns    = 200
	e2bFiles   = 20
)

// e2bFigures is the "e2b" figure: the official e2b JS SDK (test/e2b-sdk,
// run with node) against warren's E2B front, and warren's own Go SDK
// against the native API, in the same run on the same server:
// Sandbox.create, commands.run('true') and a 1 MiB files.write+read,
// p50 and p99 of each, and the ratio of the p50s (goal ≤ 1.3×).
func e2bFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	if o.e2bURL == "" {
		return fmt.Errorf("the private server has no E2B front")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return fmt.Errorf("node is not installed: %w", err)
	}
	dir := o.E2BSDKDir
	if dir == "" {
		dir = filepath.Join("test", "e2b-sdk")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		return fmt.Errorf("the e2b SDK is not installed in %s (scripts/install-deps.sh): %w", dir, err)
	}
	if err := warmUp(ctx, c); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "e2b: the official SDK through the E2B front (%d creates, %d runs, %d 1 MiB write+read)...\n", e2bCreates, e2bRuns, e2bFiles)
	cmd := exec.CommandContext(ctx, node, "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+o.e2bURL, "E2B_SANDBOX_URL="+o.e2bURL,
		"E2B_API_KEY=e2b_"+hex.EncodeToString([]byte(o.apiToken)), "E2B_DEBUG=", "E2B_TEMPLATE=busybox",
		"WARREN_URL="+o.apiURL, "WARREN_TOKEN="+o.apiToken,
		fmt.Sprintf("BENCH_CREATES=%d", e2bCreates), fmt.Sprintf("BENCH_RUNS=%d", e2bRuns), fmt.Sprintf("BENCH_FILES=%d", e2bFiles))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("bench.mjs: %w: %s", err, tail(stderr.String(), 400))
	}
	var sdk struct{ Create, Run, Files, NodeCreate, NodeRun, NodeFiles []float64 }
	if err := json.Unmarshal(bytes.TrimSpace(out), &sdk); err != nil {
		return fmt.Errorf("bench.mjs printed %q: %w", tail(string(out), 200), err)
	}
	fmt.Fprintln(o.Out, "e2b: warren's Go SDK through the native API...")
	native, err := nativeE2BLoops(ctx, c)
	if err != nil {
		return err
	}
	fmt.Fprintln(o.Out, "e2b: the E2B front from Go (its wire, no SDK)...")
	front, err := frontE2BLoops(ctx, o.e2bURL, o.apiToken)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name          string
		e2b, viaNode  []float64
		native, front []time.Duration
	}{
		{"Sandbox.create", sdk.Create, sdk.NodeCreate, native.create, front.create},
		{"commands.run('true')", sdk.Run, sdk.NodeRun, native.run, front.run},
		{"1 MiB files.write+read", sdk.Files, sdk.NodeFiles, native.files, front.files},
	} {
		e, n, v, g := percentiles(millis(f.e2b)), percentiles(f.native), percentiles(millis(f.viaNode)), percentiles(f.front)
		rep.add("e2b SDK "+f.name+" p50", ms(e.p50), "ms", fmt.Sprintf("p99 %.1f ms; native API: Go SDK p50 %.2f ms, p99 %.1f ms; node fetch p50 %.2f ms, p99 %.1f ms",
			ms(e.p99), ms(n.p50), ms(n.p99), ms(v.p50), ms(v.p99)))
		if n.p50 > 0 {
			rep.add("ratio e2b SDK / native Go SDK "+f.name+" p50", float64(e.p50)/float64(n.p50), "×", "goal ≤ 1.3")
		}
		if n.p50 > 0 && g.p50 > 0 {
			rep.add("ratio E2B front / native API from Go "+f.name+" p50", float64(g.p50)/float64(n.p50), "×",
				fmt.Sprintf("the front's own cost: its wire from Go p50 %.2f ms, p99 %.1f ms (goal ≤ 1.3)", ms(g.p50), ms(g.p99)))
		}
		if v.p50 > 0 {
			rep.add("ratio e2b SDK / native API from node "+f.name+" p50", float64(e.p50)/float64(v.p50), "×", "same client runtime: the front's and the SDK's own cost")
		}
	}
	if a, g := percentiles(native.runArgv), percentiles(front.run); a.p50 > 0 && g.p50 > 0 {
		rep.add("ratio E2B front / native API from Go commands.run('true') as the same argv p50", float64(g.p50)/float64(a.p50), "×",
			fmt.Sprintf("native streamed exec of /bin/sh -l -c true (a process start, as the front runs it) p50 %.2f ms, p99 %.1f ms (goal ≤ 1.3)", ms(a.p50), ms(a.p99)))
	}
	return nil
}

type nativeSamples struct {
	create, run, files []time.Duration
	// runArgv: the argv the front runs for commands.run('true'), streamed
	// (a process start, where the session's live shell starts none).
	runArgv []time.Duration
}

// nativeE2BLoops times what bench.mjs does, with the Go SDK.
func nativeE2BLoops(ctx context.Context, c *warren.Client) (*nativeSamples, error) {
	var s nativeSamples
	for i := 0; i < e2bCreates; i++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", TTL: 300})
		if err != nil {
			return nil, err
		}
		s.create = append(s.create, time.Since(t0))
		if _, err := c.Delete(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", TTL: 600})
	if err != nil {
		return nil, err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	for i := 0; i < 5+e2bRuns; i++ {
		t0 := time.Now()
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"}); err != nil {
			return nil, err
		}
		if i >= 5 {
			s.run = append(s.run, time.Since(t0))
		}
	}
	argv := api.ExecRequest{Argv: []string{"/bin/sh", "-l", "-c", "true"}, Cwd: "/root"}
	for i := 0; i < 5+e2bRuns; i++ {
		t0 := time.Now()
		if _, err := c.ExecStreamFunc(ctx, sb.ID, argv, func(api.ExecEvent) error { return nil }); err != nil {
			return nil, err
		}
		if i >= 5 {
			s.runArgv = append(s.runArgv, time.Since(t0))
		}
	}
	mib := e2bPayload()
	for i := 0; i < e2bFiles; i++ {
		t0 := time.Now()
		if _, err := c.WriteFileBytes(ctx, sb.ID, "/tmp/bench.bin", mib, 0o644); err != nil {
			return nil, err
		}
		back, err := c.ReadFileBytes(ctx, sb.ID, "/tmp/bench.bin")
		if err != nil {
			return nil, err
		}
		s.files = append(s.files, time.Since(t0))
		if len(back) != len(mib) {
			return nil, fmt.Errorf("read %d bytes, wrote %d", len(back), len(mib))
		}
	}
	return &s, nil
}

// warmUp waits until the private server creates sandboxes (its node
// has joined) and has built the busybox image.
func warmUp(ctx context.Context, c *warren.Client) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
		if err == nil {
			_, err = c.Delete(ctx, sb.ID)
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the private server does not create sandboxes: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// frontE2BLoops times what bench.mjs does by speaking the E2B front's
// wire from Go (the requests the SDK sends, e2b.md §6), so the front's
// cost is compared with the native API's in one client runtime.
func frontE2BLoops(ctx context.Context, base, token string) (*nativeSamples, error) {
	key := "e2b_" + hex.EncodeToString([]byte(token))
	f := &e2bWire{hc: &http.Client{}, base: base, ctl: map[string]string{"X-API-KEY": key}}
	var s nativeSamples
	var err error
	if s.create, err = f.createLoop(ctx); err != nil {
		return nil, err
	}
	id, err := f.create(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.delete(ctx, id) }()
	envd := map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": key, "Connect-Protocol-Version": "1"}
	if s.run, err = f.runLoop(ctx, envd); err != nil {
		return nil, err
	}
	if s.files, err = f.filesLoop(ctx, envd); err != nil {
		return nil, err
	}
	return &s, nil
}

// e2bWire is a client of the E2B front's wire: its base URL and the
// control plane's headers (the API key).
type e2bWire struct {
	hc   *http.Client
	base string
	ctl  map[string]string
}

// do sends one request with body (of Content-Type ctype when not empty)
// and headers hdr, and returns the answer's body; an error when the
// status is not want.
func (f *e2bWire) do(ctx context.Context, method, path, ctype string, body []byte, hdr map[string]string, want int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, f.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, tail(string(b), 200))
	}
	return b, nil
}

// create creates a busybox sandbox through the front and returns its id.
func (f *e2bWire) create(ctx context.Context) (string, error) {
	b, err := f.do(ctx, "POST", "/v2/sandboxes", "application/json", []byte(`{"templateID":"busybox","timeout":600}`), f.ctl, http.StatusCreated)
	if err != nil {
		return "", err
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	return sb.SandboxID, json.Unmarshal(b, &sb)
}

// delete deletes sandbox id through the front.
func (f *e2bWire) delete(ctx context.Context, id string) error {
	_, err := f.do(ctx, "DELETE", "/sandboxes/"+id, "", nil, f.ctl, http.StatusNoContent)
	return err
}

// createLoop times e2bCreates creates, each followed by a delete (not
// timed).
func (f *e2bWire) createLoop(ctx context.Context) ([]time.Duration, error) {
	var ds []time.Duration
	for i := 0; i < e2bCreates; i++ {
		t0 := time.Now()
		id, err := f.create(ctx)
		if err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t0))
		if err := f.delete(ctx, id); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// runLoop times e2bRuns process starts of `bash -l -c true` (after 5
// untimed ones) with the envd headers envd, each until the process ended.
func (f *e2bWire) runLoop(ctx context.Context, envd map[string]string) ([]time.Duration, error) {
	start := []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","true"]},"stdin":false}`)
	frame := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(start))), start...)
	var ds []time.Duration
	for i := 0; i < 5+e2bRuns; i++ {
		t0 := time.Now()
		b, err := f.do(ctx, "POST", "/process.Process/Start", "application/connect+json", frame, envd, http.StatusOK)
		if err != nil {
			return nil, err
		}
		if !bytes.Contains(b, []byte(`"exitCode"`)) && !bytes.Contains(b, []byte(`"exited":true`)) {
			return nil, fmt.Errorf("Start answered %q", tail(string(b), 200))
		}
		if i >= 5 {
			ds = append(ds, time.Since(t0))
		}
	}
	return ds, nil
}

// filesLoop times e2bFiles round trips of a 1 MiB file (a multipart
// upload, built inside the timing as the SDK builds it, then a download)
// with the envd headers envd.
func (f *e2bWire) filesLoop(ctx context.Context, envd map[string]string) ([]time.Duration, error) {
	mib := e2bPayload()
	var ds []time.Duration
	for i := 0; i < e2bFiles; i++ {
		t0 := time.Now()
		body, ctype, err := multipartFile("/tmp/bench.bin", mib)
		if err != nil {
			return nil, err
		}
		if _, err := f.do(ctx, "POST", "/files?path=%2Ftmp%2Fbench.bin", ctype, body, envd, http.StatusOK); err != nil {
			return nil, err
		}
		back, err := f.do(ctx, "GET", "/files?path=%2Ftmp%2Fbench.bin", "", nil, envd, http.StatusOK)
		if err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t0))
		if len(back) != len(mib) {
			return nil, fmt.Errorf("read %d bytes, wrote %d", len(back), len(mib))
		}
	}
	return ds, nil
}

// multipartFile is a multipart form of one part "file" named filename
// holding data: the body and its Content-Type.
func multipartFile(filename string, data []byte) ([]byte, string, error) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="`+filename+`"`)
	h.Set("Content-Type", "application/octet-stream")
	pw, err := mw.CreatePart(h)
	if err != nil {
		return nil, "", err
	}
	_, _ = pw.Write(data)
	_ = mw.Close()
	return buf.Bytes(), mw.FormDataContentType(), nil
}

// e2bPayload is the 1 MiB file of the files figures (bytes i mod 251).
func e2bPayload() []byte {
	mib := make([]byte, 1<<20)
	for i := range mib {
		mib[i] = byte(i % 251)
	}
	return mib
}

func millis(v []float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
