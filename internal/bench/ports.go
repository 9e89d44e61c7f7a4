package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/confine"
	warren "github.com/warrenhq/warren/sdk/go"
)

// portsBigMB is the file the "ports" figure downloads.
const portsBigMB = 256

// portsFigures is the "ports" figure (issue 16, item 6): a file served by
// busybox httpd inside a sandbox, downloaded through the API's port proxy
// (GET /v1/sandboxes/{id}/ports/8000/big) and directly (a connection made
// inside the sandbox's network namespace, as the edge makes its own), in
// the same run; and the p50/p99 of a small GET both ways, interleaved.
// Every request is a new connection to the server inside (busybox httpd
// closes after each answer, and the proxy opens a stream per request);
// the client keeps its connection to the API.
func portsFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	fmt.Fprintf(o.Out, "ports: %d MiB and small GETs through the port proxy and directly...\n", portsBigMB)
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", MemoryMB: 512, DiskMB: portsBigMB + 256})
	if err != nil {
		return err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	setup := fmt.Sprintf("mkdir -p /www && head -c %d /dev/zero > /www/big && echo hello > /www/small", portsBigMB<<20)
	if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: setup}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("prepare the files: %v %+v", err, r)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "busybox httpd -f -p 8000 -h /www", Background: true}); err != nil {
		return err
	}
	pidfd, err := agentPidfd(o.dataDir, sb.ID)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	direct := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return confine.DialLoopback(ctx, pidfd, 8000)
		},
		DisableKeepAlives: true, DisableCompression: true,
	}}
	proxied := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 4}}
	auth := map[string]string{"Authorization": "Bearer " + o.apiToken}
	proxyURL := o.apiURL + "/v1/sandboxes/" + sb.ID + "/ports/8000"
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := getN(ctx, proxied, proxyURL+"/small", auth, 6); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("the server inside never answered: %w", err)
		}
	}
	size := int64(portsBigMB) << 20
	best := map[string]float64{}
	for i := 0; i < 3; i++ {
		for _, leg := range []struct {
			name string
			hc   *http.Client
			url  string
			hdr  map[string]string
		}{{"direct", direct, "http://sandbox/big", nil}, {"proxy", proxied, proxyURL + "/big", auth}} {
			rate, err := timeTransfer(ctx, leg.hc, http.MethodGet, leg.url, leg.hdr, size)
			if err != nil {
				return fmt.Errorf("%s download: %w", leg.name, err)
			}
			best[leg.name] = max(best[leg.name], rate)
		}
	}
	rep.add(fmt.Sprintf("port download %d MiB, direct (inside the netns)", portsBigMB), best["direct"], "MB/s", "best of 3")
	rep.add(fmt.Sprintf("port download %d MiB, through the API's port proxy", portsBigMB), best["proxy"], "MB/s", "best of 3")
	rep.add("ratio port proxy / direct, download", best["proxy"]/best["direct"], "×", "")
	const n = 300
	var dl, pl []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := getN(ctx, direct, "http://sandbox/small", nil, 6); err != nil {
			return fmt.Errorf("direct small GET: %w", err)
		}
		t1 := time.Now()
		if _, err := getN(ctx, proxied, proxyURL+"/small", auth, 6); err != nil {
			return fmt.Errorf("proxied small GET: %w", err)
		}
		dl, pl = append(dl, t1.Sub(t0)), append(pl, time.Since(t1))
	}
	d, p := percentiles(dl), percentiles(pl)
	rep.add("port small GET p50, direct", ms(d.p50), "ms", fmt.Sprintf("p99 %.2f ms, %d requests, a new connection each", ms(d.p99), n))
	rep.add("port small GET p50, through the port proxy", ms(p.p50), "ms", fmt.Sprintf("p99 %.2f ms; adds %.2f ms at p50", ms(p.p99), ms(p.p50)-ms(d.p50)))
	return nil
}

// getN GETs u and checks that the answer is 200 with want bytes.
func getN(ctx context.Context, hc *http.Client, u string, hdr map[string]string, want int64) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err == nil && (resp.StatusCode != http.StatusOK || got != want) {
		err = fmt.Errorf("status %d, %d bytes", resp.StatusCode, got)
	}
	return got, err
}

// agentPidOf reads the host pid of sandbox id's agent from its record.
func agentPidOf(dataDir, id string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "edge", "sandboxes", id+".json"))
	if err != nil {
		return 0, err
	}
	var rec struct {
		Handle struct {
			Pid int `json:"pid"`
		} `json:"handle"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Handle.Pid == 0 {
		return 0, fmt.Errorf("record of %s: %v", id, err)
	}
	return rec.Handle.Pid, nil
}

// agentPidfd opens a pidfd of sandbox id's agent (the caller closes it).
func agentPidfd(dataDir, id string) (int, error) {
	pid, err := agentPidOf(dataDir, id)
	if err != nil {
		return -1, err
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd of the agent: %w", err)
	}
	return fd, nil
}
