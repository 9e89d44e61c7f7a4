package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/runtime/microvm"
)

// Where an idle microVM's host memory goes, and how many idle microVMs
// this node holds (issue 17).

// guestMiB is the guest memory of the VMs the vm figures start.
const guestMiB = 256

// vmParts is QEMU processes' memory by part, in KiB: the guest's RAM, TCG's
// code buffer, the rest of QEMU's anonymous memory (heap, threads' stacks,
// device state) and file mappings (the kernel file, the initramfs, QEMU's
// binary and libraries: page cache shared by every VM).
type vmParts struct {
	rss, pss                 int64
	guest, tcg, qemu, files  int64 // PSS
	guestRSS, tcgRSS, ksmRSS int64
}

func (p *vmParts) add(o vmParts) {
	p.rss += o.rss
	p.pss += o.pss
	p.guest += o.guest
	p.tcg += o.tcg
	p.qemu += o.qemu
	p.files += o.files
	p.guestRSS += o.guestRSS
	p.tcgRSS += o.tcgRSS
	p.ksmRSS += o.ksmRSS
}

// qemuParts reads /proc/pid/smaps. The guest's RAM is the mapping of the
// guest's size; TCG's code buffer the anonymous one of its size (QEMU
// leaves its last page as a guard).
func qemuParts(pid int, accel string) (vmParts, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return vmParts{}, err
	}
	defer f.Close()
	return parseSmaps(f, accel)
}

// parseSmaps sums an smaps file by part.
func parseSmaps(r io.Reader, accel string) (vmParts, error) {
	var p vmParts
	kind := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		if !strings.HasSuffix(fs[0], ":") && strings.Contains(fs[0], "-") {
			kind = mappingKind(fs, accel)
			continue
		}
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fs[1], 10, 64)
		switch fs[0] {
		case "Rss:":
			p.rss += v
			switch kind {
			case "guest":
				p.guestRSS += v
			case "tcg":
				p.tcgRSS += v
			}
		case "Pss:":
			p.pss += v
			switch kind {
			case "guest":
				p.guest += v
			case "tcg":
				p.tcg += v
			case "file":
				p.files += v
			default:
				p.qemu += v
			}
		case "KSM:":
			p.ksmRSS += v
		}
	}
	return p, sc.Err()
}

// mappingKind classifies an smaps header line's mapping.
// The guest's RAM is the mapping of the guest's size: anonymous, or the
// RAM file of a memory template or a fork mapped privately.
func mappingKind(fs []string, accel string) string {
	file := len(fs) >= 6 && strings.HasPrefix(fs[5], "/")
	lo, hi, ok := strings.Cut(fs[0], "-")
	if !ok {
		return "qemu"
	}
	a, err1 := strconv.ParseUint(lo, 16, 64)
	b, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil {
		return "qemu"
	}
	size := b - a
	isTCG := func(mb int) bool { tcg := uint64(mb) << 20; return size <= tcg && size > tcg-1<<20 }
	switch {
	case size == guestMiB<<20:
		return "guest"
	case file:
		return "file"
	case strings.EqualFold(accel, "tcg") && (isTCG(microvm.TCGBufferMB) || isTCG(microvm.RestoredTCGBufferMB)):
		return "tcg"
	}
	return "qemu"
}

// idleFigures: the host memory of the idle microVMs ids (per VM, by part; availBefore in KiB),
// and how many idle microVMs of 256 MiB this node holds, by memory (their
// PSS against MemAvailable before they started) and by CPU (what an idle
// one uses: under TCG the guest's timer ticks are emulated).
func idleFigures(ctx context.Context, o Options, rep *Report, ids []string, accel string, availBefore int64, started time.Duration) error {
	n := len(ids)
	pids := make([]int, n)
	for i, id := range ids {
		if pids[i] = qemuPid(id); pids[i] == 0 {
			return fmt.Errorf("no QEMU process for %s", id)
		}
	}
	parts, err := sumParts(pids, accel)
	if err != nil {
		return err
	}
	availAfter := memAvailable() >> 10
	cpu, err := idleCPU(ctx, pids, 10*time.Second)
	if err != nil {
		return err
	}
	per := func(kib int64) float64 { return float64(kib) / float64(n) / 1024 }
	rep.add("host memory per idle microVM, PSS ("+accel+")", per(parts.pss), "MiB",
		fmt.Sprintf("%d VMs of 256 MiB, 10 s after the last create; per VM (PSS): guest RAM %.0f, TCG code buffer %.0f, QEMU's own %.0f, shared files (kernel, initramfs, QEMU, libraries) %.0f MiB; RSS %.0f MiB (guest RAM %.0f, TCG %.0f); MemAvailable fell by %.0f MiB per VM",
			n, per(parts.guest), per(parts.tcg), per(parts.qemu), per(parts.files), per(parts.rss), per(parts.guestRSS), per(parts.tcgRSS), float64(availBefore-availAfter)/float64(n)/1024))

	cores := float64(goruntime.NumCPU())
	byMem := float64(availBefore) / (float64(parts.pss) / float64(n))
	byCPU := cores / (cpu / float64(n))
	holds, bound := byMem, "memory"
	if byCPU < byMem {
		holds, bound = byCPU, "CPU"
	}
	rep.add("idle microVMs this node holds ("+accel+")", float64(int64(holds)), "VMs",
		fmt.Sprintf("bound by %s: by memory %.0f (MemAvailable %.1f GiB before the run / %.0f MiB PSS per VM), by CPU %.0f (an idle VM uses %.1f %% of a core, %d cores); %d started for real in %.1f s, each answered exec; admission counts the requested 256 MiB",
			bound, byMem, float64(availBefore)/1024/1024, per(parts.pss), byCPU, 100*cpu/float64(n), int(cores), n, started.Seconds()))
	if o.VM.KSM {
		return ksmFigure(ctx, o, rep, pids, accel)
	}
	return nil
}

func sumParts(pids []int, accel string) (vmParts, error) {
	var sum vmParts
	for _, pid := range pids {
		p, err := qemuParts(pid, accel)
		if err != nil {
			return vmParts{}, err
		}
		sum.add(p)
	}
	return sum, nil
}

// idleCPU is the cores pids use together over d (utime + stime).
func idleCPU(ctx context.Context, pids []int, d time.Duration) (float64, error) {
	ticks := func() (int64, error) {
		var sum int64
		for _, pid := range pids {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err != nil {
				return 0, err
			}
			// Fields after the command's closing parenthesis: state is
			// the first, utime the 12th, stime the 13th.
			s := string(b)
			fs := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
			if len(fs) < 13 {
				return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
			}
			u, _ := strconv.ParseInt(fs[11], 10, 64)
			st, _ := strconv.ParseInt(fs[12], 10, 64)
			sum += u + st
		}
		return sum, nil
	}
	a, err := ticks()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	b, err := ticks()
	if err != nil {
		return 0, err
	}
	const userHZ = 100 // USER_HZ on Linux
	return float64(b-a) / userHZ / time.Since(t0).Seconds(), nil
}

// KSM's knobs (Documentation/admin-guide/mm/ksm.rst).
const ksmDir = "/sys/kernel/mm/ksm/"

// ksmFigure turns the host's KSM on (QEMU marks guest RAM mergeable by
// default), waits until it has scanned everything twice and the sharing
// settles, measures the idle VMs pids again and puts KSM's knobs back.
func ksmFigure(ctx context.Context, o Options, rep *Report, pids []int, accel string) error {
	knobs := []string{"run", "pages_to_scan"}
	old := map[string]string{}
	for _, k := range knobs {
		b, err := os.ReadFile(ksmDir + k)
		if err != nil {
			return fmt.Errorf("ksm: %w", err)
		}
		old[k] = strings.TrimSpace(string(b))
	}
	defer func() {
		for _, k := range knobs {
			_ = os.WriteFile(ksmDir+k, []byte(old[k]), 0o644)
		}
	}()
	read := func(k string) int64 {
		b, _ := os.ReadFile(ksmDir + k)
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v
	}
	if err := os.WriteFile(ksmDir+"pages_to_scan", []byte("1000"), 0o644); err != nil {
		return fmt.Errorf("ksm: %w", err)
	}
	if err := os.WriteFile(ksmDir+"run", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("ksm: %w", err)
	}
	fmt.Fprintf(o.Out, "microvm memory with KSM: waiting for two full scans and a steady sharing...\n")
	t0 := time.Now()
	scans0 := read("full_scans")
	// pages_sharing sampled every 5 s; done after at least a minute and two
	// full scans, once it grew by less than 1 % over the last 15 s (on a
	// loaded host ksmd may fall behind: at most 5 minutes).
	var sharing []int64
	for time.Since(t0) < 5*time.Minute {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
		sharing = append(sharing, read("pages_sharing"))
		k := len(sharing)
		if time.Since(t0) >= time.Minute && read("full_scans") >= scans0+2 && k > 3 &&
			sharing[k-1]-sharing[k-4] <= sharing[k-1]/100 {
			break
		}
	}
	scans := read("full_scans") - scans0
	parts, err := sumParts(pids, accel)
	if err != nil {
		return err
	}
	n := len(pids)
	per := func(kib int64) float64 { return float64(kib) / float64(n) / 1024 }
	rep.add("host memory per idle microVM with KSM, PSS ("+accel+")", per(parts.pss), "MiB",
		fmt.Sprintf("the same %d VMs after %.0f s of KSM (%d full scans, pages_to_scan 1000): guest RAM %.0f, TCG %.0f, QEMU's own %.0f, files %.0f MiB (PSS); %.0f MiB per VM merged. KSM is host-wide and shares pages across tenants (a timing side channel): an operator's choice, off by default",
			n, time.Since(t0).Seconds(), scans, per(parts.guest), per(parts.tcg), per(parts.qemu), per(parts.files), per(parts.ksmRSS)))
	return nil
}
