package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// Slow-read figure: the rate of the slow client, and how much of the file
// it reads (the memory is sampled after each 100 MiB).
const (
	slowReadRate = 5e6  // bytes/s
	slowReadMB   = 1024 // the 1 GiB (215 s at the rate)
)

// slowRead is the "slow-read" figure: the memory (VmRSS) of this process,
// which holds the private server's apiserver and edge, while a client
// reads a TransferMB file through the API (GET /v1/sandboxes/{id}/files)
// at 5 MB/s: before the read, after each 100 MiB up to 1 GiB (or the
// whole file, if smaller), and the most seen in between (sampled each
// second).
// Bounded means no growth with the bytes read: every hop holds at most
// its window while the client is slow.
func slowRead(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	size := int64(o.TransferMB) << 20
	if size <= 0 {
		return fmt.Errorf("slow-read: --transfer-mb must be positive")
	}
	upto := min(size, slowReadMB<<20)
	fmt.Fprintf(o.Out, "slow-read: %d MiB of a %d MiB file read at 5 MB/s (%.0f s)...\n", upto>>20, o.TransferMB, float64(upto)/slowReadRate)
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", MemoryMB: int64(o.TransferMB) + 512, DiskMB: int64(o.TransferMB) + 256})
	if err != nil {
		return err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("dd if=/dev/zero of=/big bs=1M count=%d 2>/dev/null", o.TransferMB)}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("write the file in the sandbox: %v %+v", err, r)
	}
	runtime.GC()
	debug.FreeOSMemory()
	before := rssMiB()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, o.apiURL+"/v1/sandboxes/"+sb.ID+"/files?"+url.Values{"path": {"/big"}}.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+o.apiToken)
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	type mark struct {
		read      int64
		rss, heap float64
	}
	var marks []mark // each 100 MiB read
	var peak float64
	var read int64
	buf := make([]byte, 64<<10)
	start, sampled := time.Now(), time.Now()
	for read < upto {
		n, err := resp.Body.Read(buf[:min(int64(len(buf)), upto-read)])
		read += int64(n)
		if next := int64(len(marks)+1) * 100 << 20; read >= next || read == upto {
			// RSS as it is, then the live heap: what a collection keeps
			// (in use before it counts garbage not yet collected).
			rss := rssMiB()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			marks = append(marks, mark{read, rss, float64(ms.HeapAlloc) / (1 << 20)})
		}
		if time.Since(sampled) >= time.Second {
			peak, sampled = max(peak, rssMiB()), time.Now()
		}
		if err == io.EOF && read < upto {
			return fmt.Errorf("the download ended after %d of %d bytes", read, size)
		}
		if err != nil && err != io.EOF {
			return err
		}
		// The pace: read bytes take read/rate seconds from the start.
		if d := time.Until(start.Add(time.Duration(float64(read) / slowReadRate * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
	}
	took := time.Since(start)
	rep.add("slow-read RSS of apiserver+edge before the read", before, "MiB", fmt.Sprintf("%d MiB file", o.TransferMB))
	for _, m := range marks {
		rep.add(fmt.Sprintf("slow-read RSS after %d MiB read", m.read>>20), m.rss, "MiB", fmt.Sprintf("live Go heap %.1f MiB", m.heap))
	}
	rep.add("slow-read RSS, most during the read", max(peak, marks[len(marks)-1].rss), "MiB",
		fmt.Sprintf("sampled each second; %d MiB read in %.0f s (%.1f MB/s)", read>>20, took.Seconds(), float64(read)/1e6/took.Seconds()))
	return nil
}

// rssMiB is this process's resident memory (VmRSS) in MiB.
func rssMiB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
