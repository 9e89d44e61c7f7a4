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
	s := &simulation{cfg: cfg, exe: exe, dir: dir}
	defer s.stop()
	if err := s.startProcesses(); err != nil {
		return err
	}
	if err := s.connect(ctx); err != nil {
		return err
	}
	return s.measure(ctx)
}

// simulation is the state of one Run: its processes, its clients of the
// apiservers, and what the phases measured for the report.
type simulation struct {
	cfg Config
	exe string // this binary, run as every process
	dir string // the processes' data and logs

	procs     []*proc // every process started, in order
	natsProcs []*proc
	apiProcs  []*proc
	edges     *proc
	all       []*proc // the processes measured, this one last

	urls    []string // of the apiservers
	token   string   // the admin token
	clients []*warren.Client

	spec     api.CreateSandboxRequest // of every create but the burst's
	live     int                      // sandboxes created
	singles  int64                    // created by the single-create phase
	batched  int64                    // by the batch phase
	filled   int64                    // by the fill phase
	singleEl time.Duration            // the single-create phase's length
	phaseUse map[string][]usage       // per phase, per process of all
	empty    []usage                  // before the first create
	held     []usage                  // once filled to Hold
}

// start starts this binary with args as process name, its output in
// name.log.
func (s *simulation) start(name string, args ...string) (*proc, error) {
	cmd := exec.Command(s.exe, args...)
	if name == "apiserver0" && os.Getenv("WARREN_SIM_PPROF") != "" {
		cmd.Env = append(os.Environ(), "WARREN_PPROF="+os.Getenv("WARREN_SIM_PPROF"))
	}
	logf, _ := os.Create(filepath.Join(s.dir, name+".log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd}
	s.procs = append(s.procs, p)
	return p, nil
}

// stop ends the processes, last started first: SIGTERM, then SIGKILL
// after 20 seconds.
func (s *simulation) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		_ = s.procs[i].cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func(c *exec.Cmd) { _ = c.Wait(); close(done) }(s.procs[i].cmd)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = s.procs[i].cmd.Process.Kill()
		}
	}
}

// logOf is the end of process name's log (its last 2000 bytes).
func (s *simulation) logOf(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	out := string(b)
	if len(out) > 2000 {
		out = out[len(out)-2000:]
	}
	return out
}

// simAuth are the NATS credential arguments of the simulation's
// processes: the NATS servers', the apiservers' and the simulated edges'.
type simAuth struct{ nats, api, edges []string }

// auth makes the NATS credentials, unless cfg.NoAuth: one per simulated
// node (each then has its own connection), one for the apiservers.
func (s *simulation) auth() (simAuth, error) {
	a := simAuth{nats: []string{"--no-auth"}, api: []string{}, edges: []string{"--conns", "8"}}
	if s.cfg.NoAuth {
		return a, nil
	}
	authDir := filepath.Join(s.dir, "nats-auth")
	var names []string
	for i := 0; i < s.cfg.Nodes; i++ {
		names = append(names, fmt.Sprintf("sim%d", i))
	}
	if _, err := bus.EnsureAuth(authDir, names); err != nil {
		return a, err
	}
	a.nats = []string{"--auth-dir", authDir}
	a.api = []string{"--nats-nkey", filepath.Join(authDir, bus.SeedFile(bus.RoleAPIServer, ""))}
	a.edges = []string{"--auth-dir", authDir}
	return a, nil
}

// startProcesses starts the NATS servers (a cluster when there are
// several), the apiservers and the process of the simulated edges.
func (s *simulation) startProcesses() error {
	cfg := s.cfg
	var clientURLs, routes []string
	for i := 0; i < cfg.NATSServers; i++ {
		clientURLs = append(clientURLs, "nats://"+freeAddr())
		routes = append(routes, "nats-route://"+freeAddr())
	}
	auth, err := s.auth()
	if err != nil {
		return err
	}
	for i := 0; i < cfg.NATSServers; i++ {
		args := []string{"nats", "--name", fmt.Sprintf("n%d", i), "--listen", strings.TrimPrefix(clientURLs[i], "nats://"),
			"--data-dir", filepath.Join(s.dir, fmt.Sprintf("nats%d", i))}
		args = append(args, auth.nats...)
		if cfg.NATSServers > 1 {
			args = append(args, "--cluster-listen", strings.TrimPrefix(routes[i], "nats-route://"), "--routes", strings.Join(routes, ","))
		}
		p, err := s.start(fmt.Sprintf("nats%d", i), args...)
		if err != nil {
			return err
		}
		s.natsProcs = append(s.natsProcs, p)
	}
	natsURL := strings.Join(clientURLs, ",")
	replicas := "1"
	if cfg.NATSServers >= 3 {
		replicas = "3"
	}
	for i := 0; i < cfg.APIServers; i++ {
		addr := freeAddr()
		s.urls = append(s.urls, "http://"+addr)
		p, err := s.start(fmt.Sprintf("apiserver%d", i), append([]string{"apiserver", "--nats", natsURL, "--replicas", replicas,
			"--listen", addr, "--data-dir", filepath.Join(s.dir, fmt.Sprintf("api%d", i))}, auth.api...)...)
		if err != nil {
			return err
		}
		s.apiProcs = append(s.apiProcs, p)
	}
	// Simulated edges: capacity for Hold + everything else, spread evenly.
	per := (cfg.Hold+cfg.Burst+cfg.Clients*100000)/max(1, cfg.Nodes) + 1000
	s.edges, err = s.start("edges", append([]string{"sim-edges", "--nats", natsURL, "--nodes", strconv.Itoa(cfg.Nodes),
		"--max-sandboxes", strconv.Itoa(per)}, auth.edges...)...)
	return err
}

// connect waits (90 seconds at most) for every apiserver to answer and
// every simulated node to be up, reads the admin token and makes the
// clients.
func (s *simulation) connect(ctx context.Context) error {
	deadline := time.Now().Add(90 * time.Second)
	for _, u := range s.urls {
		for {
			resp, err := http.Get(u + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sim: apiserver %s did not start:\n%s", u, s.logOf("apiserver0"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := range s.apiProcs {
		if b, err := os.ReadFile(filepath.Join(s.dir, fmt.Sprintf("api%d", i), "admin-token")); err == nil {
			s.token = strings.TrimSpace(string(b))
		}
	}
	tr := warren.NewTransport()
	tr.MaxIdleConnsPerHost = 1024
	hc := &http.Client{Transport: tr}
	s.clients = make([]*warren.Client, len(s.urls))
	for i, u := range s.urls {
		s.clients[i] = warren.New(u, s.token, warren.WithHTTPClient(hc), warren.WithRetry(1, 0, 0))
	}
	for {
		nodes, err := s.clients[0].Nodes(ctx)
		up := 0
		for _, n := range nodes {
			if n.State == "up" {
				up++
			}
		}
		if err == nil && up >= s.cfg.Nodes {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: %d of %d nodes up (%v):\n%s", up, s.cfg.Nodes, err, s.logOf("edges"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // every apiserver sees every node
	return nil
}

// snap is the usage of every measured process now.
func (s *simulation) snap() []usage {
	out := make([]usage, len(s.all))
	for i, p := range s.all {
		out[i] = p.usage()
	}
	return out
}

// measure runs the four phases (single creates, batch creates, the fill to
// Hold, the burst), writing a row of the table for each, then the table of
// the processes.
func (s *simulation) measure(ctx context.Context) error {
	self := &proc{name: "load generator (warren sim)", cmd: &exec.Cmd{Process: &os.Process{Pid: os.Getpid()}}}
	s.all = append(append(append([]*proc{}, s.natsProcs...), s.apiProcs...), s.edges, self)
	out := s.cfg.Out
	fmt.Fprintf(out, "warren sim: %d NATS server(s), %d apiservers, %d simulated nodes, %d clients on this machine\n\n",
		s.cfg.NATSServers, s.cfg.APIServers, s.cfg.Nodes, s.cfg.Clients)
	fmt.Fprintf(out, "| phase | sandboxes | seconds | creations/s | p50 ms | p99 ms | errors |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	s.live = 0
	s.phaseUse = map[string][]usage{}
	s.spec = api.CreateSandboxRequest{Image: "busybox", CPU: 0.01, MemoryMB: 16, Labels: map[string]string{"job": "sim"}}
	s.singlePhase(ctx)
	s.batchPhase(ctx)
	if err := s.fillPhase(ctx); err != nil {
		return err
	}
	s.burstPhase(ctx)
	s.reportProcesses()
	return nil
}

// singlePhase runs cfg.Clients clients, each creating one sandbox per call
// (with the SDK or a lean HTTP/1.1 client) for cfg.Duration, and writes
// the phase's row.
func (s *simulation) singlePhase(ctx context.Context) {
	cfg := s.cfg
	u0 := s.snap()
	s.empty = u0
	var n1, e1 atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, cfg.Clients)
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < cfg.Clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			create := func() error { _, err := s.clients[c%len(s.clients)].CreateWithKey(ctx, s.spec, ""); return err }
			if !cfg.SDKClients {
				rc, err := newRawClient(s.urls[c%len(s.urls)], s.token, s.spec)
				if err != nil {
					e1.Add(1)
					return
				}
				defer rc.close()
				create = rc.create
			}
			for time.Since(t0) < cfg.Duration {
				st := time.Now()
				if err := create(); err != nil {
					if e1.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					continue
				}
				lat[c] = append(lat[c], time.Since(st))
				n1.Add(1)
			}
		}(c)
	}
	wg.Wait()
	el := time.Since(t0)
	s.singles = n1.Load()
	s.live += int(s.singles)
	var alll []time.Duration
	for _, l := range lat {
		alll = append(alll, l...)
	}
	p50, p99 := pct(alll, 50), pct(alll, 99)
	kind := "lean HTTP/1.1"
	if cfg.SDKClients {
		kind = "Go SDK"
	}
	fmt.Fprintf(cfg.Out, "| single creates, %d clients (%s) | %d | %.1f | %.0f | %.2f | %.2f | %d |\n", cfg.Clients, kind, n1.Load(), el.Seconds(),
		float64(n1.Load())/el.Seconds(), ms(p50), ms(p99), e1.Load())
	if v := firstErr.Load(); v != nil {
		fmt.Fprintf(os.Stderr, "warren sim: first single-create error: %s\n", v)
	}
	s.phaseUse["single"] = diff(s.snap(), u0, el)
	s.singleEl = el
}

// batchPhase runs max(2, cfg.Clients/8) clients, each creating
// cfg.BatchSize sandboxes per call for cfg.Duration, and writes the
// phase's row.
func (s *simulation) batchPhase(ctx context.Context) {
	cfg := s.cfg
	u0 := s.snap()
	var n2, e2 atomic.Int64
	var blat []time.Duration
	var bmu sync.Mutex
	t0 := time.Now()
	bc := max(2, cfg.Clients/8)
	var wg sync.WaitGroup
	for c := 0; c < bc; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := s.clients[c%len(s.clients)]
			for time.Since(t0) < cfg.Duration {
				st := time.Now()
				r, err := cl.BatchCreate(ctx, api.BatchCreateRequest{Count: cfg.BatchSize, Spec: s.spec, IDsOnly: true})
				if err != nil {
					e2.Add(int64(cfg.BatchSize))
					continue
				}
				bmu.Lock()
				blat = append(blat, time.Since(st))
				bmu.Unlock()
				n2.Add(int64(r.Created))
				e2.Add(int64(r.Failed))
			}
		}(c)
	}
	wg.Wait()
	el := time.Since(t0)
	s.batched = n2.Load()
	s.live += int(s.batched)
	fmt.Fprintf(cfg.Out, "| batch creates of %d, %d clients (latency per call) | %d | %.1f | %.0f | %.2f | %.2f | %d |\n", cfg.BatchSize, bc,
		n2.Load(), el.Seconds(), float64(n2.Load())/el.Seconds(), ms(pct(blat, 50)), ms(pct(blat, 99)), e2.Load())
	s.phaseUse["batch"] = diff(s.snap(), u0, el)
}

// fillPhase creates sandboxes in batches of 4096 (four calls at a time)
// until cfg.Hold are live, then lets the heartbeats settle and takes the
// held snapshot. It fails when more creates failed than Hold.
func (s *simulation) fillPhase(ctx context.Context) error {
	cfg := s.cfg
	t0 := time.Now()
	var n3, e3 atomic.Int64
	var wg sync.WaitGroup
	for s.live < cfg.Hold {
		need := cfg.Hold - s.live
		chunk := min(need, 4096)
		par := min(4, (need+chunk-1)/chunk)
		for c := 0; c < par; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				r, err := s.clients[c%len(s.clients)].BatchCreate(ctx, api.BatchCreateRequest{Count: chunk, Spec: s.spec, IDsOnly: true})
				if err != nil {
					e3.Add(int64(chunk))
					return
				}
				n3.Add(int64(r.Created))
				e3.Add(int64(r.Failed))
			}(c)
		}
		wg.Wait()
		s.filled = n3.Load()
		s.live = int(s.singles + s.batched + s.filled)
		if e3.Load() > int64(cfg.Hold) {
			return fmt.Errorf("sim: filling failed: %d errors", e3.Load())
		}
	}
	el := time.Since(t0)
	time.Sleep(2 * time.Second) // heartbeats settle
	s.held = s.snap()
	fmt.Fprintf(cfg.Out, "| fill to %d live (batches of 4096) | %d | %.1f | %.0f | | | %d |\n", cfg.Hold, n3.Load(), el.Seconds(),
		float64(n3.Load())/el.Seconds(), e3.Load())
	return nil
}

// burstPhase creates cfg.Burst sandboxes in one call and writes the
// phase's row.
func (s *simulation) burstPhase(ctx context.Context) {
	cfg := s.cfg
	u0 := s.snap()
	t0 := time.Now()
	r, err := s.clients[0].BatchCreate(ctx, api.BatchCreateRequest{Count: cfg.Burst, Spec: api.CreateSandboxRequest{
		Image: "busybox", CPU: 0.01, MemoryMB: 16, Labels: map[string]string{"job": "burst"}}, IDsOnly: true})
	el := time.Since(t0)
	if err != nil {
		fmt.Fprintf(cfg.Out, "| burst of %d in one call | 0 | %.2f | | | | %v |\n", cfg.Burst, el.Seconds(), err)
	} else {
		s.live += r.Created
		fmt.Fprintf(cfg.Out, "| burst of %d in one call | %d | %.2f | %.0f | | | %d |\n", cfg.Burst, r.Created, el.Seconds(),
			float64(r.Created)/el.Seconds(), r.Failed)
	}
	s.phaseUse["burst"] = diff(s.snap(), u0, el)
}

// reportProcesses writes the table of the processes (their cores per
// phase, their memory empty, held and at the end) and the CPU each single
// create cost.
func (s *simulation) reportProcesses() {
	out := s.cfg.Out
	fmt.Fprintf(out, "\nLive sandboxes at the end: %d.\n\n", s.live)
	fmt.Fprintf(out, "| process | cores, single phase | cores, batch phase | cores, burst | RSS MiB, 0 live | RSS MiB, %d live | RSS MiB, end | bytes per live sandbox |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n", int(s.singles+s.batched+s.filled))
	end := s.snap()
	for i, p := range s.all {
		perSB := fmt.Sprintf("%.0f", (end[i].rss-s.empty[i].rss)*1024*1024/float64(max(1, s.live)))
		fmt.Fprintf(out, "| %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.0f | %s |\n", p.name, s.phaseUse["single"][i].cpu, s.phaseUse["batch"][i].cpu,
			s.phaseUse["burst"][i].cpu, s.empty[i].rss, s.held[i].rss, end[i].rss, perSB)
	}
	// CPU per create is steadier than creations/s on a shared machine: it
	// does not depend on what else runs.
	if n := float64(s.singles); n > 0 {
		var sum float64
		per := make([]string, len(s.all))
		for i, p := range s.all {
			c := s.phaseUse["single"][i].cpu * s.singleEl.Seconds() / n * 1e6
			sum += c
			per[i] = fmt.Sprintf("%s %.0f", p.name, c)
		}
		fmt.Fprintf(out, "\nSingle creates: %.0f µs of CPU per create over all processes (%s).\n", sum, strings.Join(per, ", "))
	}
	fmt.Fprintf(out, "\n(The simulated edges are one process holding every fake sandbox; the load generator is this process.)\n")
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
