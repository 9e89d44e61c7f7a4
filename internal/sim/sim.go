package sim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	warren "github.com/warrenhq/warren/sdk/go"
)

// Config says how big a simulation to run.
type Config struct {
	NATSServers int           // 1 (one server) or 3 (a cluster)
	APIServers  int           // apiserver processes
	Nodes       int           // simulated nodes
	Clients     int           // concurrent clients creating one sandbox per call
	SDKClients  bool          // those clients use the Go SDK (default: a lean HTTP/1.1 client)
	Duration    time.Duration // of each sustained phase
	BatchSize   int           // sandboxes per call in the sustained batch phase
	Hold        int           // live sandboxes to reach (filled by batch creates)
	Burst       int           // sandboxes in the final one-call burst
	// NoAuth runs NATS without credentials (to measure what they cost);
	// otherwise every part, each simulated node too, has its own NKey.
	NoAuth bool
	Out    io.Writer
}

// proc is one process of the simulation.
type proc struct {
	name string
	cmd  *exec.Cmd
}

type usage struct{ cpu, rss float64 } // CPU seconds, RSS MiB

func (p *proc) usage() usage {
	pid := p.cmd.Process.Pid
	var u usage
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+2:])
			if len(f) > 13 {
				ut, _ := strconv.ParseFloat(f[11], 64)
				st, _ := strconv.ParseFloat(f[12], 64)
				u.cpu = (ut + st) / 100
			}
		}
	}
	if f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				u.rss = kb / 1024
			}
		}
		f.Close()
	}
	return u
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Run runs the whole simulation and writes a report to cfg.Out.
func Run(ctx context.Context, cfg Config) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "warren-sim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var procs []*proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			_ = procs[i].cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func(c *exec.Cmd) { _ = c.Wait(); close(done) }(procs[i].cmd)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = procs[i].cmd.Process.Kill()
			}
		}
	}()
	start := func(name string, args ...string) (*proc, error) {
		cmd := exec.Command(exe, args...)
		if name == "apiserver0" && os.Getenv("WARREN_SIM_PPROF") != "" {
			cmd.Env = append(os.Environ(), "WARREN_PPROF="+os.Getenv("WARREN_SIM_PPROF"))
		}
		logf, _ := os.Create(filepath.Join(dir, name+".log"))
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		p := &proc{name: name, cmd: cmd}
		procs = append(procs, p)
		return p, nil
	}
	logOf := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
		s := string(b)
		if len(s) > 2000 {
			s = s[len(s)-2000:]
		}
		return s
	}

	// NATS.
	var clientURLs, routes []string
	for i := 0; i < cfg.NATSServers; i++ {
		clientURLs = append(clientURLs, "nats://"+freeAddr())
		routes = append(routes, "nats-route://"+freeAddr())
	}
	// Credentials: one per simulated node (each then has its own
	// connection), one for the apiservers.
	authDir := filepath.Join(dir, "nats-auth")
	authArgs := []string{"--no-auth"}
	apiAuth := []string{}
	edgeAuth := []string{"--conns", "8"}
	if !cfg.NoAuth {
		var names []string
		for i := 0; i < cfg.Nodes; i++ {
			names = append(names, fmt.Sprintf("sim%d", i))
		}
		if _, err := bus.EnsureAuth(authDir, names); err != nil {
			return err
		}
		authArgs = []string{"--auth-dir", authDir}
		apiAuth = []string{"--nats-nkey", filepath.Join(authDir, bus.SeedFile(bus.RoleAPIServer, ""))}
		edgeAuth = []string{"--auth-dir", authDir}
	}
	var natsProcs []*proc
	for i := 0; i < cfg.NATSServers; i++ {
		args := []string{"nats", "--name", fmt.Sprintf("n%d", i), "--listen", strings.TrimPrefix(clientURLs[i], "nats://"),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("nats%d", i))}
		args = append(args, authArgs...)
		if cfg.NATSServers > 1 {
			args = append(args, "--cluster-listen", strings.TrimPrefix(routes[i], "nats-route://"), "--routes", strings.Join(routes, ","))
		}
		p, err := start(fmt.Sprintf("nats%d", i), args...)
		if err != nil {
			return err
		}
		natsProcs = append(natsProcs, p)
	}
	natsURL := strings.Join(clientURLs, ",")
	replicas := "1"
	if cfg.NATSServers >= 3 {
		replicas = "3"
	}
	// Apiservers.
	var apiProcs []*proc
	var urls []string
	for i := 0; i < cfg.APIServers; i++ {
		addr := freeAddr()
		urls = append(urls, "http://"+addr)
		p, err := start(fmt.Sprintf("apiserver%d", i), append([]string{"apiserver", "--nats", natsURL, "--replicas", replicas,
			"--listen", addr, "--data-dir", filepath.Join(dir, fmt.Sprintf("api%d", i))}, apiAuth...)...)
		if err != nil {
			return err
		}
		apiProcs = append(apiProcs, p)
	}
	// Simulated edges: capacity for Hold + everything else, spread evenly.
	per := (cfg.Hold+cfg.Burst+cfg.Clients*100000)/max(1, cfg.Nodes) + 1000
	edges, err := start("edges", append([]string{"sim-edges", "--nats", natsURL, "--nodes", strconv.Itoa(cfg.Nodes),
		"--max-sandboxes", strconv.Itoa(per)}, edgeAuth...)...)
	if err != nil {
		return err
	}
	// Wait for health and the token.
	deadline := time.Now().Add(90 * time.Second)
	var token string
	for _, u := range urls {
		for {
			resp, err := http.Get(u + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sim: apiserver %s did not start:\n%s", u, logOf("apiserver0"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := range apiProcs {
		if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("api%d", i), "admin-token")); err == nil {
			token = strings.TrimSpace(string(b))
		}
	}
	tr := warren.NewTransport()
	tr.MaxIdleConnsPerHost = 1024
	hc := &http.Client{Transport: tr}
	clients := make([]*warren.Client, len(urls))
	for i, u := range urls {
		clients[i] = warren.New(u, token, warren.WithHTTPClient(hc), warren.WithRetry(1, 0, 0))
	}
	for {
		nodes, err := clients[0].Nodes(ctx)
		up := 0
		for _, n := range nodes {
			if n.State == "up" {
				up++
			}
		}
		if err == nil && up >= cfg.Nodes {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: %d of %d nodes up (%v):\n%s", up, cfg.Nodes, err, logOf("edges"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // every apiserver sees every node

	self := &proc{name: "load generator (warren sim)", cmd: &exec.Cmd{Process: &os.Process{Pid: os.Getpid()}}}
	all := append(append(append([]*proc{}, natsProcs...), apiProcs...), edges, self)
	snap := func() []usage {
		out := make([]usage, len(all))
		for i, p := range all {
			out[i] = p.usage()
		}
		return out
	}
	out := cfg.Out
	fmt.Fprintf(out, "warren sim: %d NATS server(s), %d apiservers, %d simulated nodes, %d clients on this machine\n\n",
		cfg.NATSServers, cfg.APIServers, cfg.Nodes, cfg.Clients)
	fmt.Fprintf(out, "| phase | sandboxes | seconds | creations/s | p50 ms | p99 ms | errors |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	live := 0
	phaseUse := map[string][]usage{}
	spec := api.CreateSandboxRequest{Image: "busybox", CPU: 0.01, MemoryMB: 16, Labels: map[string]string{"job": "sim"}}

	// Phase 1: many clients, one sandbox per call.
	u0 := snap()
	empty := u0
	var n1, e1 atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, cfg.Clients)
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < cfg.Clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			create := func() error { _, err := clients[c%len(clients)].CreateWithKey(ctx, spec, ""); return err }
			if !cfg.SDKClients {
				rc, err := newRawClient(urls[c%len(urls)], token, spec)
				if err != nil {
					e1.Add(1)
					return
				}
				defer rc.close()
				create = rc.create
			}
			for time.Since(t0) < cfg.Duration {
				s := time.Now()
				if err := create(); err != nil {
					if e1.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					continue
				}
				lat[c] = append(lat[c], time.Since(s))
				n1.Add(1)
			}
		}(c)
	}
	wg.Wait()
	el := time.Since(t0)
	live += int(n1.Load())
	var alll []time.Duration
	for _, l := range lat {
		alll = append(alll, l...)
	}
	p50, p99 := pct(alll, 50), pct(alll, 99)
	kind := "lean HTTP/1.1"
	if cfg.SDKClients {
		kind = "Go SDK"
	}
	fmt.Fprintf(out, "| single creates, %d clients (%s) | %d | %.1f | %.0f | %.2f | %.2f | %d |\n", cfg.Clients, kind, n1.Load(), el.Seconds(),
		float64(n1.Load())/el.Seconds(), ms(p50), ms(p99), e1.Load())
	if v := firstErr.Load(); v != nil {
		fmt.Fprintf(os.Stderr, "warren sim: first single-create error: %s\n", v)
	}
	phaseUse["single"] = diff(snap(), u0, el)
	singleEl := el

	// Phase 2: batch creates.
	u0 = snap()
	var n2, e2 atomic.Int64
	var blat []time.Duration
	var bmu sync.Mutex
	t0 = time.Now()
	bc := max(2, cfg.Clients/8)
	for c := 0; c < bc; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := clients[c%len(clients)]
			for time.Since(t0) < cfg.Duration {
				s := time.Now()
				r, err := cl.BatchCreate(ctx, api.BatchCreateRequest{Count: cfg.BatchSize, Spec: spec, IDsOnly: true})
				if err != nil {
					e2.Add(int64(cfg.BatchSize))
					continue
				}
				bmu.Lock()
				blat = append(blat, time.Since(s))
				bmu.Unlock()
				n2.Add(int64(r.Created))
				e2.Add(int64(r.Failed))
			}
		}(c)
	}
	wg.Wait()
	el = time.Since(t0)
	live += int(n2.Load())
	fmt.Fprintf(out, "| batch creates of %d, %d clients (latency per call) | %d | %.1f | %.0f | %.2f | %.2f | %d |\n", cfg.BatchSize, bc,
		n2.Load(), el.Seconds(), float64(n2.Load())/el.Seconds(), ms(pct(blat, 50)), ms(pct(blat, 99)), e2.Load())
	phaseUse["batch"] = diff(snap(), u0, el)

	// Phase 3: fill to Hold live sandboxes.
	before := snap()
	t0 = time.Now()
	var n3, e3 atomic.Int64
	for live < cfg.Hold {
		need := cfg.Hold - live
		chunk := min(need, 4096)
		par := min(4, (need+chunk-1)/chunk)
		for c := 0; c < par; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				r, err := clients[c%len(clients)].BatchCreate(ctx, api.BatchCreateRequest{Count: chunk, Spec: spec, IDsOnly: true})
				if err != nil {
					e3.Add(int64(chunk))
					return
				}
				n3.Add(int64(r.Created))
				e3.Add(int64(r.Failed))
			}(c)
		}
		wg.Wait()
		live = int(n1.Load() + n2.Load() + n3.Load())
		if e3.Load() > int64(cfg.Hold) {
			return fmt.Errorf("sim: filling failed: %d errors", e3.Load())
		}
	}
	el = time.Since(t0)
	time.Sleep(2 * time.Second) // heartbeats settle
	held := snap()
	fmt.Fprintf(out, "| fill to %d live (batches of 4096) | %d | %.1f | %.0f | | | %d |\n", cfg.Hold, n3.Load(), el.Seconds(),
		float64(n3.Load())/el.Seconds(), e3.Load())

	// Phase 4: the burst, one call.
	u0 = snap()
	t0 = time.Now()
	r, err := clients[0].BatchCreate(ctx, api.BatchCreateRequest{Count: cfg.Burst, Spec: api.CreateSandboxRequest{
		Image: "busybox", CPU: 0.01, MemoryMB: 16, Labels: map[string]string{"job": "burst"}}, IDsOnly: true})
	el = time.Since(t0)
	if err != nil {
		fmt.Fprintf(out, "| burst of %d in one call | 0 | %.2f | | | | %v |\n", cfg.Burst, el.Seconds(), err)
	} else {
		live += r.Created
		fmt.Fprintf(out, "| burst of %d in one call | %d | %.2f | %.0f | | | %d |\n", cfg.Burst, r.Created, el.Seconds(),
			float64(r.Created)/el.Seconds(), r.Failed)
	}
	phaseUse["burst"] = diff(snap(), u0, el)

	// Processes.
	fmt.Fprintf(out, "\nLive sandboxes at the end: %d.\n\n", live)
	fmt.Fprintf(out, "| process | cores, single phase | cores, batch phase | cores, burst | RSS MiB, 0 live | RSS MiB, %d live | RSS MiB, end | bytes per live sandbox |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n", int(n1.Load()+n2.Load()+n3.Load()))
	end := snap()
	_ = before
	for i, p := range all {
		perSB := fmt.Sprintf("%.0f", (end[i].rss-empty[i].rss)*1024*1024/float64(max(1, live)))
		fmt.Fprintf(out, "| %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.0f | %s |\n", p.name, phaseUse["single"][i].cpu, phaseUse["batch"][i].cpu,
			phaseUse["burst"][i].cpu, empty[i].rss, held[i].rss, end[i].rss, perSB)
	}
	// CPU per create is steadier than creations/s on a shared machine: it
	// does not depend on what else runs.
	if n := float64(n1.Load()); n > 0 {
		var sum float64
		per := make([]string, len(all))
		for i, p := range all {
			c := phaseUse["single"][i].cpu * singleEl.Seconds() / n * 1e6
			sum += c
			per[i] = fmt.Sprintf("%s %.0f", p.name, c)
		}
		fmt.Fprintf(out, "\nSingle creates: %.0f µs of CPU per create over all processes (%s).\n", sum, strings.Join(per, ", "))
	}
	fmt.Fprintf(out, "\n(The simulated edges are one process holding every fake sandbox; the load generator is this process.)\n")
	return nil
}

// diff is CPU in cores (seconds per second) over el, per process.
func diff(a, b []usage, el time.Duration) []usage {
	out := make([]usage, len(a))
	for i := range a {
		out[i] = usage{cpu: (a[i].cpu - b[i].cpu) / el.Seconds(), rss: a[i].rss}
	}
	return out
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
