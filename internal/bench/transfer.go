package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// transfer is the "transfer" figure: a TransferMB file downloaded and
// uploaded through the API (GET and PUT /v1/sandboxes/{id}/files), against
// a plain net/http file server on the same host, in the same run, with the
// same HTTP client (target: ≥ 50 % of its throughput).
func transfer(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	size := int64(o.TransferMB) << 20
	fmt.Fprintf(o.Out, "transfer: %d MiB download and upload, warren and plain net/http...\n", o.TransferMB)
	dir, err := os.MkdirTemp("", "warren-bench-transfer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := writeZeros(filepath.Join(dir, "big"), size); err != nil {
		return err
	}
	// A second upload target of the plain server on the filesystem that
	// holds the sandboxes' writable layers (a btrfs image on a loop
	// device): the same disk as the sandbox's upload writes to.
	diskDir := filepath.Join(o.dataDir, "writable", "bench-plain-upload")
	if err := os.MkdirAll(diskDir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(diskDir)
	plainURL, stop, err := plainFileServer(dir, diskDir)
	if err != nil {
		return err
	}
	defer stop()

	// The sandbox's memory limit also bounds its page cache: with less
	// memory than the file, the download would read most of it from disk
	// while the plain server reads its copy from the host's page cache.
	// Room for the file and 512 MiB more puts both on the same footing.
	// Its disk holds the file, the last upload and the next one (written
	// beside the file it replaces).
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", MemoryMB: 2*int64(o.TransferMB) + 512, DiskMB: 3*int64(o.TransferMB) + 256})
	if err != nil {
		return err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	// The file is written inside the sandbox, timed: the rate its own
	// disk takes writes at bounds what an upload can reach.
	start := time.Now()
	if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("dd if=/dev/zero of=/big bs=1M count=%d 2>/dev/null", o.TransferMB)}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("write the file in the sandbox: %v %+v", err, r)
	}
	rep.add(fmt.Sprintf("transfer in-sandbox write (dd) %d MiB", o.TransferMB), float64(size)/1e6/time.Since(start).Seconds(), "MB/s", "the sandbox's own write rate")
	legs := transferLegs(plainURL, o.apiURL+"/v1/sandboxes/"+sb.ID+"/files?", o.apiToken)
	rates, cpus := transferRounds(ctx, o, rep, legs, size)
	// Each figure is the median of its rounds, each ratio the median of
	// the rounds' ratios; the notes list every round.
	for _, l := range legs {
		if rs := rates[l.name]; len(rs) > 0 {
			rep.add(fmt.Sprintf("transfer %s %d MiB", l.name, o.TransferMB), median(rs), "MB/s",
				fmt.Sprintf("median of %d rounds %s; %.0f ms CPU per GiB in this process", len(rs), "("+fmtRounds(rs, "%.0f")+")", median(cpus[l.name])))
		}
	}
	transferRatio(rep, rates, "download", "plain download", "warren download", "target ≥ 0.5")
	transferRatio(rep, rates, "upload", "plain upload", "warren upload", "target ≥ 0.5")
	transferRatio(rep, rates, "upload, same disk", "plain upload to the sandboxes' disk", "warren upload", "both write to the sandboxes' filesystem")
	return nil
}

// httpLeg is one leg of the transfer figure: a request by its method and
// URL, with headers hdr.
type httpLeg struct {
	name, method, url string
	hdr               map[string]string
}

// transferLegs are the transfer figure's legs, in the order they run:
// downloads and uploads from the plain server at plainURL and through the
// sandbox's files API (files: its URL up to the query) with token.
func transferLegs(plainURL, files, token string) []httpLeg {
	auth := map[string]string{"Authorization": "Bearer " + token}
	return []httpLeg{
		{"plain download", http.MethodGet, plainURL + "/big", nil},
		{"warren download", http.MethodGet, files + url.Values{"path": {"/big"}}.Encode(), auth},
		{"plain upload", http.MethodPut, plainURL + "/up", nil},
		{"plain upload to the sandboxes' disk", http.MethodPut, plainURL + "/disk/up", nil},
		{"warren upload", http.MethodPut, files + url.Values{"path": {"/up"}}.Encode(), auth},
	}
}

// transferRounds runs every leg o.TransferRounds times, the legs
// alternating, so that a change of the host's state (page cache,
// writeback, a neighbour's load) falls on both sides of a ratio: each
// leg's rates (MB/s) and CPU per GiB by leg name. A failed leg is
// reported as a result and ends the rounds. WARREN_BENCH_LEGS, when set,
// runs only the legs whose names it contains (to profile one leg alone).
func transferRounds(ctx context.Context, o Options, rep *Report, legs []httpLeg, size int64) (rates, cpus map[string][]float64) {
	rates, cpus = map[string][]float64{}, map[string][]float64{}
	hc := &http.Client{}
	for range o.TransferRounds {
		for _, l := range legs {
			if x := os.Getenv("WARREN_BENCH_LEGS"); x != "" && !strings.Contains(x, l.name) {
				continue // for profiling one leg alone
			}
			rate, perGiB, err := transferLeg(ctx, hc, l.method, l.url, l.hdr, size)
			if err != nil {
				rep.add("transfer "+l.name, 0, "MB/s", "failed: "+err.Error())
				return rates, cpus
			}
			rates[l.name] = append(rates[l.name], rate)
			cpus[l.name] = append(cpus[l.name], perGiB)
		}
	}
	return rates, cpus
}

// transferRatio adds the ratio of leg ours to leg plain as the median of
// the rounds' ratios (the notes list every round), when both ran as many
// rounds.
func transferRatio(rep *Report, rates map[string][]float64, name, plain, ours, note string) {
	p, w := rates[plain], rates[ours]
	if len(p) == 0 || len(p) != len(w) {
		return
	}
	rs := make([]float64, len(p))
	for i := range p {
		rs[i] = w[i] / p[i]
	}
	rep.add("ratio warren / plain net/http "+name, median(rs), "×", fmt.Sprintf("median of the rounds' ratios %s; %s", "("+fmtRounds(rs, "%.2f")+")", note))
}

// transferLeg times one leg: its rate (MB/s) and the CPU this process
// spent on it per GiB (the client and the plain server, or the client, the
// apiserver and the edge; not the agent): less noisy than the rate on a
// shared machine. Each leg starts with no dirty pages of the legs before
// it: the disk's writeback of one upload would slow the next.
func transferLeg(ctx context.Context, hc *http.Client, method, u string, hdr map[string]string, size int64) (rate, perGiB float64, err error) {
	syscall.Sync()
	cpu0 := processCPU()
	rate, err = timeTransfer(ctx, hc, method, u, hdr, size)
	perGiB = (processCPU() - cpu0).Seconds() * 1000 / (float64(size) / (1 << 30))
	return rate, perGiB, err
}

// timeTransfer sends one request and reads its whole answer: a PUT sends
// size zero bytes, a GET must receive size bytes. It returns MB/s.
func timeTransfer(ctx context.Context, hc *http.Client, method, u string, hdr map[string]string, size int64) (float64, error) {
	var body io.Reader
	if method == http.MethodPut {
		body = io.LimitReader(zeros{}, size)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, err
	}
	if method == http.MethodPut {
		req.ContentLength = size
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	if method == http.MethodGet && n != size {
		return 0, fmt.Errorf("%d of %d bytes", n, size)
	}
	return float64(size) / 1e6 / time.Since(start).Seconds(), nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func writeZeros(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, io.LimitReader(zeros{}, size)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plainFileServer serves dir with net/http on loopback: GET serves a
// file, PUT writes one (into diskDir for a path under /disk/).
func plainFileServer(dir, diskDir string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	fs := http.FileServer(http.Dir(dir))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			fs.ServeHTTP(w, r)
			return
		}
		to := dir
		if strings.HasPrefix(r.URL.Path, "/disk/") {
			to = diskDir
		}
		f, err := os.Create(filepath.Join(to, filepath.Base(r.URL.Path)))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, err = io.Copy(f, r.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// processCPU is the user and system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
