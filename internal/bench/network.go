package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/hoststat"
	warren "github.com/warrenhq/warren/sdk/go"
)

// The "network" figures (issue 16): what a network costs a sandbox, each
// against its peer in the same run. A stand-in mirror lives in a network
// namespace of the bench's own (nothing leaves the machine), at
// netMirror, reached from the host through a veth (host end netMirrorHost,
// a /24 of the benchmarking range 198.18.0.0/15, so that no test's fake
// internet on 10.x clashes with it): an HTTP server of zeros on port 8080
// and a listener that accepts and closes on 8081 (the rule-change probe).
const (
	netMirror     = "198.18.77.2"
	netMirrorHost = "198.18.77.1"
	netMirrorCIDR = "198.18.77.0/24"
	netBigMB      = 512
	// netRounds is how many times each pair of legs runs; the figures
	// are medians over the rounds (the machine is shared and noisy).
	netRounds = 5
)

// networkFigures measures, in one run: create→exec→stop with a network
// against without (host CPU per sandbox and rate); idle networked
// sandboxes' extra host memory; TCP download throughput sandbox←mirror
// against host←mirror; a rule change to its effect. The port proxy's
// figures are the "ports" set, run with this one.
func networkFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	mir, err := startMirror()
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	defer mir.close()
	var errs []error
	for _, f := range []struct {
		name string
		fn   func(context.Context, Options, *warren.Client, *Report) error
	}{{"create", netCreateFigures}, {"throughput", netThroughput}, {"rule", netRuleChange}, {"idle", netIdleMemory}} {
		if o.NetworkParts != "" && !slices.Contains(strings.Split(o.NetworkParts, ","), f.name) {
			continue
		}
		if err := f.fn(ctx, o, c, rep); err != nil {
			rep.add("network "+f.name, 0, "", "failed: "+err.Error())
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
	}
	return errors.Join(errs...)
}

// mirror is the stand-in mirror: its namespace (held by fd), veth and
// servers.
type mirror struct {
	nsfd int
	link string
	srv  *http.Server
	lns  []net.Listener
}

// startMirror makes the mirror's network namespace, wires it to the host
// with a veth, and starts its servers; close undoes all of it.
func startMirror() (*mirror, error) {
	m := &mirror{nsfd: -1, link: fmt.Sprintf("wbmir%d", os.Getpid()%100000)}
	var err error
	inNewNetns(func(fd int, e error) {
		if e != nil {
			err = e
			return
		}
		m.nsfd = fd
	})
	if err != nil {
		return nil, err
	}
	if err := m.wire(); err != nil {
		m.close()
		return nil, err
	}
	m.serve()
	return m, nil
}

// close stops the mirror's servers and removes its veth and namespace
// (whatever of them exists).
func (m *mirror) close() {
	if m.srv != nil {
		m.srv.Close()
	}
	for _, ln := range m.lns {
		ln.Close()
	}
	if l, err := netlink.LinkByName(m.link); err == nil {
		_ = netlink.LinkDel(l)
	}
	if m.nsfd >= 0 {
		unix.Close(m.nsfd)
	}
}

// wire adds the veth between the host (netMirrorHost) and the mirror's
// namespace (netMirror) and, in the namespace, listens on the mirror's
// ports 8080 and 8081.
func (m *mirror) wire() error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: m.link}, PeerName: "mir0", PeerNamespace: netlink.NsFd(m.nsfd)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	host, err := netlink.LinkByName(m.link)
	if err == nil {
		err = netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(netMirrorHost), Mask: net.CIDRMask(24, 32)}})
	}
	if err == nil {
		err = netlink.LinkSetUp(host)
	}
	if err == nil {
		err = inNetns(m.nsfd, m.listen)
	}
	return err
}

// listen, run in the mirror's namespace, sets its end of the veth and its
// loopback up and listens on netMirror's ports 8080 and 8081.
func (m *mirror) listen() error {
	l, err := netlink.LinkByName("mir0")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(netMirror), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	lo, _ := netlink.LinkByName("lo")
	_ = netlink.LinkSetUp(lo)
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	for _, port := range []string{"8080", "8081"} {
		ln, err := net.Listen("tcp4", netMirror+":"+port)
		if err != nil {
			return err
		}
		m.lns = append(m.lns, ln)
	}
	return nil
}

// serve starts the mirror's servers: on 8080 an HTTP server answering
// /N with N MiB of zeros, on 8081 a listener that accepts and closes.
func (m *mirror) serve() {
	zeros := make([]byte, 1<<20)
	m.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mb, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.Header().Set("Content-Length", strconv.Itoa(mb<<20))
		for i := 0; i < mb; i++ {
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
	})}
	go func() { _ = m.srv.Serve(m.lns[0]) }()
	go func() {
		for {
			c, err := m.lns[1].Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// inNewNetns calls f, on a locked thread, with a descriptor of a new
// network namespace (the thread is back in its own when f runs).
func inNewNetns(f func(fd int, err error)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			f(-1, err)
			return // the thread dies with the goroutine
		}
		defer unix.Close(home)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			f(-1, err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if unix.Setns(home, unix.CLONE_NEWNET) != nil {
			if err == nil {
				unix.Close(fd)
			}
			f(-1, errors.New("back to the host's network namespace"))
			return
		}
		runtime.UnlockOSThread()
		f(fd, err)
	}()
	<-done
}

// inNetns runs f on a locked thread in the network namespace of nsfd (a
// namespace descriptor or a pidfd): what f makes (sockets, links) is
// there.
func inNetns(nsfd int, f func() error) error {
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		home, e := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if e != nil {
			err = e
			runtime.UnlockOSThread()
			return
		}
		defer unix.Close(home)
		if e := unix.Setns(nsfd, unix.CLONE_NEWNET); e != nil {
			err = e
			runtime.UnlockOSThread()
			return
		}
		err = f()
		if unix.Setns(home, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	<-done
	return err
}

// median of xs (0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// fmtRounds lists each round's value with format, space-separated.
func fmtRounds(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, " ")
}

// netCreateFigures: create→exec `true`→delete from 4 clients, without a
// network and with one, the legs interleaved for netRounds rounds; the
// host CPU each sandbox cost is the CPU time of this process (the bench's
// clients and the in-process warren serve) plus that of the sandboxes'
// cgroups over the leg, divided by its cycles. Kernel threads' work
// (a network namespace's teardown runs in a kworker) is not in it.
func netCreateFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	const clients, perLeg = 4, 100
	fmt.Fprintf(o.Out, "network: create→exec→stop with and without a network, %d rounds of %d each...\n", netRounds, perLeg)
	spec := func(networked bool) api.CreateSandboxRequest {
		s := api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64}
		if networked {
			s.Network = &api.NetworkSpec{Egress: []string{netMirrorCIDR + ":8080/tcp"}}
		}
		return s
	}
	cycle := func(ctx context.Context, s api.CreateSandboxRequest) error { return cycleOf(ctx, c, s) }
	// Warm up both shapes (recycled containers of the plain one).
	for _, nw := range []bool{false, true} {
		if _, err := parallel(ctx, 2*clients, clients, func(ctx context.Context, _ int) error { return cycle(ctx, spec(nw)) }); err != nil {
			return err
		}
	}
	var cpu, sbCPU, rate [2][]float64
	var reused [2]int64
	var lat [2][]time.Duration
	for round := 0; round < netRounds; round++ {
		for k, nw := range []bool{false, true} {
			if round%2 == 1 {
				nw = !nw // alternate which leg goes first
				k = 1 - k
			}
			s := spec(nw)
			r0 := nodeRecycling(ctx, c)
			c0, s0, t0 := selfCPU(), sandboxCPU(o.cgroupParent), time.Now()
			lats, err := parallel(ctx, perLeg, clients, func(ctx context.Context, _ int) error { return cycle(ctx, s) })
			if err != nil {
				return err
			}
			took := time.Since(t0)
			inSandboxes := sandboxCPU(o.cgroupParent) - s0
			used := selfCPU() - c0 + inSandboxes
			cpu[k] = append(cpu[k], ms(used)/perLeg)
			sbCPU[k] = append(sbCPU[k], ms(inSandboxes)/perLeg)
			rate[k] = append(rate[k], perLeg/took.Seconds())
			lat[k] = append(lat[k], lats...)
			time.Sleep(1500 * time.Millisecond) // the node view comes with the next heartbeat
			reused[k] += nodeRecycling(ctx, c).Reused - r0.Reused
		}
	}
	p0, p1 := percentiles(lat[0]), percentiles(lat[1])
	c0, c1 := median(cpu[0]), median(cpu[1])
	rep.add("network: create→exec→stop host CPU per sandbox, without network", c0, "ms",
		fmt.Sprintf("median of %d rounds of %d (%s), of which in the sandboxes' cgroups %.2f ms; %.1f sandboxes/s, p50 %.1f ms; %d in a recycled container", netRounds, perLeg, fmtRounds(cpu[0], "%.2f"), median(sbCPU[0]), median(rate[0]), ms(p0.p50), reused[0]))
	rep.add("network: create→exec→stop host CPU per sandbox, with network", c1, "ms",
		fmt.Sprintf("median of %d rounds of %d (%s), of which in the sandboxes' cgroups %.2f ms; %.1f sandboxes/s, p50 %.1f ms; %d in a recycled container", netRounds, perLeg, fmtRounds(cpu[1], "%.2f"), median(sbCPU[1]), median(rate[1]), ms(p1.p50), reused[1]))
	diffs := make([]float64, len(cpu[0]))
	for i := range diffs {
		diffs[i] = cpu[1][i] - cpu[0][i]
	}
	rep.add("network: extra host CPU per networked sandbox", median(diffs), "ms",
		fmt.Sprintf("median of the rounds' differences (%s); bench process + sandbox cgroups, not kworkers; target ≤ 1.5 ms", fmtRounds(diffs, "%.2f")))
	rep.add("network: ratio create rate with / without network", median(rate[1])/median(rate[0]), "×", fmt.Sprintf("%d clients", clients))
	return nil
}

// netThroughput downloads netBigMB MiB from the mirror with busybox wget,
// in a networked sandbox and on the host (the host's busybox), and with
// one Go client dialling from the sandbox's network namespace and from
// the host's; the legs interleaved, netRounds times.
func netThroughput(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	fmt.Fprintf(o.Out, "network: %d MiB from the mirror, sandbox against host, %d rounds...\n", netBigMB, netRounds)
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 2, MemoryMB: 256, AlwaysOn: true, Priority: api.PriorityLatency,
		Network: &api.NetworkSpec{Egress: []string{netMirrorCIDR + ":8080/tcp"}}})
	if err != nil {
		return err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	pid, err := agentPidOf(o.dataDir, sb.ID)
	if err != nil {
		return err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of the agent: %w", err)
	}
	defer unix.Close(pidfd)
	url := fmt.Sprintf("http://%s:8080/%d", netMirror, netBigMB)
	// The host's wget is the sandbox's: the busybox of the same image,
	// chrooted into its root (the host's network namespace).
	rootfs, release, err := busyboxRoot(o.dataDir)
	if err != nil {
		return err
	}
	defer release()
	wgetIn := func() (float64, error) { return wgetInSandbox(ctx, c, sb.ID, url) }
	if _, err := wgetIn(); err != nil { // warm-up, and the path works
		return err
	}
	legs := []struct {
		name string
		fn   func() (float64, error)
	}{{"wget sandbox", wgetIn}, {"wget host", func() (float64, error) { return wgetChrooted(ctx, rootfs, "", url) }},
		{"wget netns", func() (float64, error) { return wgetChrooted(ctx, rootfs, fmt.Sprintf("/proc/%d/ns/net", pid), url) }},
		{"go sandbox", func() (float64, error) { return goGetFrom(ctx, pidfd, url) }}, {"go host", func() (float64, error) { return goGetFrom(ctx, -1, url) }}}
	got := make([][]float64, len(legs))
	for round := 0; round < netRounds; round++ {
		for j := range legs {
			k := (j + round) % len(legs)
			v, err := legs[k].fn()
			if err != nil {
				return fmt.Errorf("%s: %w", legs[k].name, err)
			}
			got[k] = append(got[k], v)
		}
	}
	reportNetThroughput(rep, got)
	return nil
}

// reportNetThroughput adds the throughput figures from the rounds' rates
// of the legs, in netThroughput's order: wget in the sandbox, on the host
// and in the sandbox's netns; the Go client in the sandbox's netns and on
// the host.
func reportNetThroughput(rep *Report, got [][]float64) {
	note := func(k int) string { return fmt.Sprintf("median of %d (%s)", netRounds, fmtRounds(got[k], "%.2f")) }
	rep.add(fmt.Sprintf("network: download %d MiB sandbox←mirror, busybox wget", netBigMB), median(got[0]), "MB/s", note(0)+"; through veth, nftables policy, masquerade")
	rep.add(fmt.Sprintf("network: download %d MiB host←mirror, busybox wget", netBigMB), median(got[1]), "MB/s", note(1)+"; the image's busybox, chrooted")
	rep.add("network: ratio sandbox / host throughput, wget", median(got[0])/median(got[1]), "×", "target ≥ 0.8")
	rep.add(fmt.Sprintf("network: download %d MiB, busybox wget in the sandbox's netns outside its cgroups and seccomp", netBigMB), median(got[2]), "MB/s", note(2)+"; nsenter --net, chrooted")
	rep.add("network: ratio sandbox's netns / host throughput, wget outside the sandbox", median(got[2])/median(got[1]), "×", "the network path alone, the same process")
	rep.add(fmt.Sprintf("network: download %d MiB sandbox←mirror, Go client in the sandbox's netns", netBigMB), median(got[3]), "MB/s", note(3))
	rep.add(fmt.Sprintf("network: download %d MiB host←mirror, Go client", netBigMB), median(got[4]), "MB/s", note(4))
	rep.add("network: ratio sandbox / host throughput, Go client", median(got[3])/median(got[4]), "×", "the same client both ways: the path alone")
}

// netRate is the rate in MB/s of a netBigMB MiB download begun at t0 and
// ending now.
func netRate(t0 time.Time) float64 {
	return float64(netBigMB<<20) / time.Since(t0).Seconds() / 1e6
}

// wgetInSandbox downloads url with busybox wget in sandbox id: MB/s.
func wgetInSandbox(ctx context.Context, c *warren.Client, id, url string) (float64, error) {
	t0 := time.Now()
	r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "wget -q -O - " + url + " >/dev/null"})
	if err != nil {
		return 0, err
	}
	if r.ExitCode != 0 {
		return 0, fmt.Errorf("wget in the sandbox: exit %d %s", r.ExitCode, r.Stderr)
	}
	return netRate(t0), nil
}

// wgetChrooted downloads url with the busybox wget of rootfs, chrooted
// into it, in the network namespace of netnsPath ("": the host's), outside
// any sandbox's cgroups and seccomp filter: MB/s.
func wgetChrooted(ctx context.Context, rootfs, netnsPath, url string) (float64, error) {
	t0 := time.Now()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "/bin/busybox", "wget", "-q", "-O", "-", url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	if netnsPath != "" {
		cmd = exec.CommandContext(ctx, "nsenter", "--net="+netnsPath, "--root="+rootfs, "/bin/busybox", "wget", "-q", "-O", "-", url)
	}
	cmd.Dir, cmd.Stdout, cmd.Stderr = "/", null, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("wget on the host: %v %s", err, stderr.String())
	}
	return netRate(t0), nil
}

// goGetFrom downloads url with a Go client whose connection is dialled in
// the network namespace of nsfd (-1: the host's): MB/s.
func goGetFrom(ctx context.Context, nsfd int, url string) (float64, error) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		if nsfd < 0 {
			return d.DialContext(ctx, network, addr)
		}
		var conn net.Conn
		err := inNetns(nsfd, func() (err error) { conn, err = d.DialContext(ctx, network, addr); return })
		return conn, err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true, DisableCompression: true}}
	t0 := time.Now()
	if _, err := getN(ctx, hc, url, nil, netBigMB<<20); err != nil {
		return 0, err
	}
	return netRate(t0), nil
}

// netRuleChange times a change of egress to its effect, seen by a probe
// that connects to the mirror's port 8081 from inside the sandbox's
// network namespace (a refused connect is a reset at once): a sandbox's
// own list (PUT /v1/sandboxes/{id}/network) and a named rule it uses
// (PUT /v1/network-rules/{name}, which reaches the edge over the bus).
// Each sample flips between allowed and refused.
func netRuleChange(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	const n = 60
	fmt.Fprintf(o.Out, "network: rule change to effect, %d changes each way...\n", n)
	rule := "bench-mirror"
	put := func(ports []int) error {
		_, err := c.PutNetworkRule(ctx, api.NetworkRule{Name: rule, CIDRs: []string{netMirrorCIDR}, Ports: ports, Protocols: []string{"tcp"}})
		return err
	}
	if err := put([]int{8080}); err != nil {
		return err
	}
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkSpec{Egress: []string{rule}}})
	if err != nil {
		return err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	pidfd, err := agentPidfd(o.dataDir, sb.ID)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	if probeMirror(pidfd) {
		return errors.New("the probe port is reachable before any rule allows it")
	}
	var own, named, call []time.Duration
	for i := 0; i < n; i++ {
		allow := i%2 == 0
		egress := []string{rule}
		if allow {
			egress = append(egress, netMirrorCIDR+":8081/tcp")
		}
		t0 := time.Now()
		if _, err := c.SetNetwork(ctx, sb.ID, egress); err != nil {
			return err
		}
		call = append(call, time.Since(t0))
		d, err := waitProbe(pidfd, allow, t0)
		if err != nil {
			return fmt.Errorf("own list: %w", err)
		}
		own = append(own, d)
	}
	if _, err := c.SetNetwork(ctx, sb.ID, []string{rule}); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		allow := i%2 == 0
		ports := []int{8080}
		if allow {
			ports = append(ports, 8081)
		}
		t0 := time.Now()
		if err := put(ports); err != nil {
			return err
		}
		d, err := waitProbe(pidfd, allow, t0)
		if err != nil {
			return fmt.Errorf("named rule: %w", err)
		}
		named = append(named, d)
	}
	po, pn, pc := percentiles(own), percentiles(named), percentiles(call)
	rep.add("network: named rule change to effect p99", ms(pn.p99), "ms", fmt.Sprintf("p50 %.2f ms, %d changes (PUT /v1/network-rules/{name} until a probe in the sandbox sees it); target ≤ 50 ms", ms(pn.p50), n))
	rep.add("network: sandbox list change to effect p99", ms(po.p99), "ms", fmt.Sprintf("p50 %.2f ms, %d changes (PUT …/network until the probe sees it; the call alone p50 %.2f ms, p99 %.2f ms)", ms(po.p50), n, ms(pc.p50), ms(pc.p99)))
	return nil
}

// probeMirror says whether a connect to the mirror's port 8081 from the
// network namespace of pidfd succeeds within 200 ms.
func probeMirror(pidfd int) bool {
	ok := false
	_ = inNetns(pidfd, func() error {
		conn, err := net.DialTimeout("tcp4", netMirror+":8081", 200*time.Millisecond)
		if err == nil {
			conn.Close()
			ok = true
		}
		return nil
	})
	return ok
}

// waitProbe polls probeMirror from pidfd's namespace until it says want,
// and returns the time since t0; an error after 10 s.
func waitProbe(pidfd int, want bool, t0 time.Time) (time.Duration, error) {
	for time.Since(t0) < 10*time.Second {
		if probeMirror(pidfd) == want {
			return time.Since(t0), nil
		}
		time.Sleep(time.Millisecond)
	}
	return 0, fmt.Errorf("no effect in 10 s (want reachable=%v)", want)
}

// netIdleMemory creates o.NetworkIdle idle sandboxes without a network,
// measures, deletes them, then as many with one: the host memory each
// took (MemAvailable) and the kernel's own part (kernelMemory) with
// warren's RSS, whose difference is what a network adds.
func netIdleMemory(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	n := o.NetworkIdle
	fmt.Fprintf(o.Out, "network: %d idle sandboxes without a network, then %d with one...\n", n, n)
	_, restore := raisePidMax(4 << 20)
	defer restore()
	type mem struct{ avail, kernel, rss int64 }
	read := func() mem {
		runtime.GC()
		settle()
		m, err := hoststat.ReadMemory()
		if err != nil {
			return mem{}
		}
		return mem{m.Available, kernelMemory(), selfRSS()}
	}
	var per [2]mem
	var took [2]time.Duration
	for k, nw := range []bool{false, true} {
		// A shape no other figure uses: no recycled container is on its
		// shelf when the plain leg starts.
		s := api.CreateSandboxRequest{Image: "busybox", CPU: 0.05, MemoryMB: 17, Labels: map[string]string{"bench": "net-idle"}}
		if nw {
			s.Network = &api.NetworkSpec{Egress: []string{netMirrorCIDR + ":8080/tcp"}}
		}
		before := read()
		var mu sync.Mutex
		var ids []string
		var failed atomic.Value
		t0 := time.Now()
		_, _ = parallel(ctx, n, 8, func(ctx context.Context, _ int) error {
			sb, err := c.Create(ctx, s)
			if err != nil {
				failed.CompareAndSwap(nil, err.Error())
				return err
			}
			mu.Lock()
			ids = append(ids, sb.ID)
			mu.Unlock()
			return nil
		})
		took[k] = time.Since(t0)
		after := read()
		deleteAll(ctx, c, ids)
		if len(ids) != n {
			return fmt.Errorf("%d of %d created: %v", len(ids), n, failed.Load())
		}
		per[k] = mem{(before.avail - after.avail) / int64(n), (after.kernel - before.kernel) / int64(n), (after.rss - before.rss) / int64(n)}
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	for k, name := range []string{"without network", "with network"} {
		rep.add("network: host memory per idle sandbox, "+name, mib(per[k].avail), "MiB",
			fmt.Sprintf("MemAvailable delta / %d (page cache of other work on the machine is in it); kernel part %.0f KiB, warren's RSS %.0f KiB; created in %.1f s",
				n, float64(per[k].kernel)/1024, float64(per[k].rss)/1024, took[k].Seconds()))
	}
	extra := per[1].kernel - per[0].kernel + per[1].rss - per[0].rss
	rep.add("network: extra host memory per networked idle sandbox", mib(extra), "MiB",
		fmt.Sprintf("the kernel's own memory (unreclaimable slab, per-CPU, page tables, stacks: %.0f KiB) and warren's RSS (%.0f KiB), with against without; MemAvailable says %.2f MiB; target ≤ 0.5 MiB",
			float64(per[1].kernel-per[0].kernel)/1024, float64(per[1].rss-per[0].rss)/1024, mib(per[1].avail-per[0].avail)))
	return nil
}

// kernelMemory is the host kernel's own memory: unreclaimable slab,
// per-CPU areas, page tables and kernel stacks (/proc/meminfo), in bytes.
// Reclaimable slab (dentries and inodes of other work's builds) is left
// out: it swings by hundreds of MiB on this shared machine.
func kernelMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var sum int64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "SUnreclaim:", "Percpu:", "PageTables:", "KernelStack:":
			v, _ := strconv.ParseInt(f[1], 10, 64)
			sum += v << 10
		}
	}
	return sum
}
