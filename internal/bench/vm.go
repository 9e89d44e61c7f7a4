package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// The microvm tier's figures (issue 17): create→first exec, and host
// memory per idle microVM of 256 MiB. Each names the accelerator (TCG is
// emulation: boots take seconds; with KVM QEMU's microvm boots in
// ~100–200 ms).

// VMOptions size the vm figures.
type VMOptions struct {
	Creates int  // sandboxes created one after another for the latency; default 8
	Idle    int  // idle VMs measured for memory and node capacity; default 20
	KSM     bool // also measure them with the host's KSM merging their memory
	Forks   int  // children of the fork from memory; default 8
}

// vmFigures measures the microvm and vm tiers' create→first exec, then
// idle microVMs of 256 MiB (host memory, via idleFigures), their pause to
// a memory snapshot and resume, and a fork from memory (vmForkFigure).
func vmFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	creates, idle := o.VM.Creates, o.VM.Idle
	if creates <= 0 {
		creates = 8
	}
	if idle <= 0 {
		idle = 20
	}
	accel, err := nodeAccelerator(ctx, c)
	if err != nil {
		return err
	}
	req := api.CreateSandboxRequest{Tier: api.TierMicroVM, Image: "busybox", MemoryMB: 256}

	for _, tier := range []string{api.TierMicroVM, api.TierVM} {
		fmt.Fprintf(o.Out, "%s create→first exec (%d, %s)...\n", tier, creates, accel)
		r := req
		r.Tier = tier
		p, err := createLatency(ctx, c, r, creates)
		if err != nil {
			return fmt.Errorf("%s: %w", tier, err)
		}
		rep.add(tier+" create→first exec p50 ("+accel+")", ms(p.p50), "ms", fmt.Sprintf("p99 %.0f ms over %d creates, 256 MiB guest", ms(p.p99), creates))
	}

	fmt.Fprintf(o.Out, "microvm memory: %d idle VMs of 256 MiB (%s)...\n", idle, accel)
	availBefore := memAvailable() >> 10 // KiB
	var ids []string
	defer func() {
		for _, id := range ids {
			_, _ = c.Delete(context.WithoutCancel(ctx), id)
		}
	}()
	t0 := time.Now()
	for range idle {
		sb, err := c.Create(ctx, req)
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
	}
	started := time.Since(t0)
	for _, id := range ids {
		if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "true"}); err != nil {
			return fmt.Errorf("idle VM %s: %w", id, err)
		}
	}
	time.Sleep(10 * time.Second) // boot work done, guest idle, free pages reported
	if err := idleFigures(ctx, o, rep, ids, accel, availBefore, started); err != nil {
		return err
	}
	if err := vmPauseFigures(ctx, c, rep, ids[:min(3, len(ids))], accel); err != nil {
		return err
	}
	return vmForkFigure(ctx, o, c, rep, req, accel)
}

// nodeAccelerator is the (last) node's microvm accelerator, upper case
// (KVM or TCG); an error when no node offers the microvm tier.
func nodeAccelerator(ctx context.Context, c *warren.Client) (string, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return "", err
	}
	accel := ""
	for _, n := range nodes {
		accel = n.Accelerator
	}
	if accel == "" {
		return "", fmt.Errorf("the node offers no microvm tier (make vm-kernel; qemu-system-x86)")
	}
	return strings.ToUpper(accel), nil
}

// vmPauseFigures pauses each of the microVMs ids (a pause is a memory
// snapshot: QEMU ends) and resumes it with an exec (the exec restores
// it): the percentiles of both.
func vmPauseFigures(ctx context.Context, c *warren.Client, rep *Report, ids []string, accel string) error {
	var pauses, resumes []time.Duration
	for _, id := range ids {
		t0 := time.Now()
		if _, err := c.Pause(ctx, id); err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0))
		if qemuPid(id) != 0 {
			return fmt.Errorf("QEMU of %s runs while it is paused", id)
		}
		t0 = time.Now()
		if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "true"}); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t0))
	}
	pp, rp := percentiles(pauses), percentiles(resumes)
	rep.add("microvm pause to a memory snapshot p50 ("+accel+")", ms(pp.p50), "ms", fmt.Sprintf("QEMU ends: host memory freed entirely; p99 %.0f ms over %d", ms(pp.p99), len(pauses)))
	rep.add("microvm resume from the snapshot → first exec p50 ("+accel+")", ms(rp.p50), "ms", fmt.Sprintf("p99 %.0f ms over %d", ms(rp.p99), len(resumes)))
	return nil
}

// vmForkFigure: POST /fork {"count": N, "memory": true} on a VM running a
// background process, until every child answered an exec; then the
// children's host memory (they share the parent's pages copy-on-write).
func vmForkFigure(ctx context.Context, o Options, c *warren.Client, rep *Report, req api.CreateSandboxRequest, accel string) error {
	n := o.VM.Forks
	if n <= 0 {
		n = 8
	}
	fmt.Fprintf(o.Out, "microvm fork of %d from memory (%s)...\n", n, accel)
	src, err := c.Create(ctx, req)
	if err != nil {
		return err
	}
	defer func() { _, _ = c.Delete(context.WithoutCancel(ctx), src.ID) }()
	if _, err := c.Exec(ctx, src.ID, api.ExecRequest{Cmd: "(i=0; while :; do i=$((i+1)); sleep 0.1; done) >/dev/null 2>&1 &"}); err != nil {
		return err
	}
	t0 := time.Now()
	res, err := c.ForkMemory(ctx, src.ID, n)
	if err != nil {
		return err
	}
	var kids []string
	defer func() {
		for _, id := range kids {
			_, _ = c.Delete(context.WithoutCancel(ctx), id)
		}
	}()
	for _, k := range res.Sandboxes {
		kids = append(kids, k.ID)
	}
	for _, id := range kids {
		if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "true"}); err != nil {
			return err
		}
	}
	took := time.Since(t0)
	time.Sleep(5 * time.Second) // the children settle
	rss, pss, err := qemuMemory(kids)
	if err != nil {
		return err
	}
	rep.add(fmt.Sprintf("microvm fork of %d from memory until all accept exec (%s)", n, accel), ms(took), "ms",
		fmt.Sprintf("one memory snapshot, disks copied, children restored side by side over one shared RAM file; their QEMUs 5 s later: RSS %.0f MiB, PSS %.0f MiB per child (256 MiB guest)",
			float64(rss)/float64(n)/1024, float64(pss)/float64(n)/1024))
	return nil
}

// createLatency creates n sandboxes of req one after another, each
// followed by `exec true` and a delete: the percentiles of create + first
// exec.
func createLatency(ctx context.Context, c *warren.Client, req api.CreateSandboxRequest, n int) (latencies, error) {
	var lat []time.Duration
	for range n {
		t0 := time.Now()
		sb, err := c.Create(ctx, req)
		if err != nil {
			return latencies{}, err
		}
		_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"})
		d := time.Since(t0)
		_, _ = c.Delete(context.WithoutCancel(ctx), sb.ID)
		if err != nil {
			return latencies{}, err
		}
		lat = append(lat, d)
	}
	return percentiles(lat), nil
}

// qemuPid is the pid of the QEMU running sandbox id (0: none).
func qemuPid(id string) int {
	out, _ := exec.Command("pgrep", "-f", "qemu-system.*warren-vm:.*/"+id+"( |$)").Output()
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

// procMemory is pid's RSS and PSS in KiB (smaps_rollup).
func procMemory(pid int) (rss, pss int64, err error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fs[1], 10, 64)
		switch fs[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss, sc.Err()
}

// qemuMemory sums the RSS and PSS of the QEMU processes of sandboxes ids.
func qemuMemory(ids []string) (rss, pss int64, err error) {
	for _, id := range ids {
		pid := qemuPid(id)
		if pid == 0 {
			return 0, 0, fmt.Errorf("no QEMU process for %s", id)
		}
		r, p, err := procMemory(pid)
		if err != nil {
			return 0, 0, err
		}
		rss += r
		pss += p
	}
	return rss, pss, nil
}
