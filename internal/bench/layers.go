package bench

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/image"
	warren "github.com/warrenhq/warren/sdk/go"
)

// LayerOptions size the layer figures (issue 3).
type LayerOptions struct {
	LayerMB           int     // create-size: the big workspace layer; default 2048
	CreateSamples     int     // create-size: creates per layer; default 20
	ImageMB           int     // lazy: the image; default 1024
	TouchPercent      float64 // lazy: share of the image the task reads; default 5
	Burst             int     // burst: sandboxes; default 500
	BurstWorkspaces   int     // burst: distinct workspaces; default 50
	WorkspaceMB       int     // burst: size of one workspace; default 4
	UpgradeWorkspaces int     // upgrade: workspaces using the toolkit; default 1000
}

func (l *LayerOptions) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.LayerMB, 2048)
	def(&l.CreateSamples, 20)
	def(&l.ImageMB, 1024)
	def(&l.Burst, 500)
	def(&l.BurstWorkspaces, 50)
	def(&l.WorkspaceMB, 4)
	def(&l.UpgradeWorkspaces, 1000)
	if l.TouchPercent <= 0 || l.TouchPercent > 100 {
		l.TouchPercent = 5
	}
}

const mib = 1 << 20

func runLayers(ctx context.Context, o Options, c *warren.Client, dataDir string, rep *Report) error {
	if !o.want("create-size") && !o.want("lazy") && !o.want("burst") && !o.want("upgrade") {
		return nil
	}
	o.Layers.defaults()
	store, err := image.Open(filepath.Join(dataDir, "images"))
	if err != nil {
		return err
	}
	work := filepath.Join(dataDir, "bench-work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	lb := &layerBench{o: o, l: o.Layers, c: c, store: store, work: work, dataDir: dataDir, rep: rep}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"create-size", lb.createSize},
		{"lazy", lb.lazy},
		{"burst", lb.burst},
		{"upgrade", lb.upgrade},
	}
	for _, s := range steps {
		if !o.want(s.name) {
			continue
		}
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("bench %s: %w", s.name, err)
		}
	}
	return nil
}

type layerBench struct {
	o       Options
	l       LayerOptions
	c       *warren.Client
	store   *image.LocalStore
	work    string
	dataDir string
	rep     *Report
}

func (b *layerBench) logf(format string, a ...any) { fmt.Fprintf(b.o.Out, format+"\n", a...) }

// fillTree writes totalMB of data under dir as files of 1 MiB (dir/<prefix>NNNNN).
func fillTree(dir, prefix string, totalMB int, seed byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	buf := make([]byte, mib)
	for i := range buf {
		buf[i] = byte(i*131) ^ seed
	}
	for i := 0; i < totalMB; i++ {
		buf[0], buf[1] = byte(i), byte(i>>8) // no two files alike
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s%05d", prefix, i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (b *layerBench) create(ctx context.Context, layers ...api.LayerAttachment) (*api.Sandbox, error) {
	return b.c.Create(ctx, api.CreateSandboxRequest{Image: image.BusyboxImage, CPU: 0.05, MemoryMB: 32, Layers: layers})
}

// createSize: create latency with a big workspace layer against an empty one.
func (b *layerBench) createSize(ctx context.Context) error {
	b.logf("create-size: packing a %d MiB workspace layer...", b.l.LayerMB)
	big, empty := filepath.Join(b.work, "big"), filepath.Join(b.work, "empty")
	if err := fillTree(filepath.Join(big, "data"), "f", b.l.LayerMB, 1); err != nil {
		return err
	}
	if err := os.MkdirAll(empty, 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	lBig, err := b.store.CreateLayerFromDir(ctx, "bench/big", 0, big)
	if err != nil {
		return err
	}
	pack := time.Since(t0)
	os.RemoveAll(big)
	if _, err := b.store.CreateLayerFromDir(ctx, "bench/empty", 0, empty); err != nil {
		return err
	}
	lat := map[string][]time.Duration{}
	first := map[string]time.Duration{}
	for i := 0; i < b.l.CreateSamples+1; i++ {
		for _, name := range []string{"bench/big", "bench/empty"} {
			t := time.Now()
			sb, err := b.create(ctx, api.LayerAttachment{Layer: name})
			if err != nil {
				return err
			}
			d := time.Since(t)
			if i == 0 {
				first[name] = d // mounts the layer: once per node
			} else {
				lat[name] = append(lat[name], d)
			}
			// Keep the first sandbox of each kind, so the layer stays
			// mounted as it is on a busy node.
			if i > 0 {
				if _, err := b.c.Delete(ctx, sb.ID); err != nil {
					return err
				}
			} else {
				defer b.c.Delete(context.WithoutCancel(ctx), sb.ID)
			}
		}
	}
	pb, pe := percentiles(lat["bench/big"]), percentiles(lat["bench/empty"])
	b.rep.add(fmt.Sprintf("create with a %d MiB workspace layer, p50", b.l.LayerMB), ms(pb.p50), "ms",
		fmt.Sprintf("p99 %.1f ms; first create (mounts the layer) %.1f ms; packing it took %.1f s (%s stored)",
			ms(pb.p99), ms(first["bench/big"]), pack.Seconds(), humanMiB(lBig.ErofsSize)))
	b.rep.add("create with an empty workspace layer, p50", ms(pe.p50), "ms",
		fmt.Sprintf("p99 %.1f ms; first create %.1f ms", ms(pe.p99), ms(first["bench/empty"])))
	if pe.p50 > 0 {
		b.rep.add("create time big / empty layer (p50)", float64(pb.p50)/float64(pe.p50), "×", "target: the same within noise (≈ 1)")
	}
	return nil
}

func humanMiB(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/mib) }

// diskDev is the block device holding path, for /proc/diskstats.
type diskDev struct{ major, minor uint32 }

func deviceOf(path string) (diskDev, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return diskDev{}, false
	}
	d := diskDev{unix.Major(st.Dev), unix.Minor(st.Dev)}
	_, _, ok := d.sectors()
	return d, ok
}

// sectors returns sectors read and written on the device so far.
func (d diskDev) sectors() (read, written int64, ok bool) {
	f, err := os.Open("/proc/diskstats")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var maj, min uint32
		var name string
		var rios, rmerge, rsect, rms, wios, wmerge, wsect int64
		n, _ := fmt.Sscan(sc.Text(), &maj, &min, &name, &rios, &rmerge, &rsect, &rms, &wios, &wmerge, &wsect)
		if n == 10 && maj == d.major && min == d.minor {
			return rsect, wsect, true
		}
	}
	return 0, 0, false
}

// dropFileCache evicts a file's pages from the page cache.
func dropFileCache(p string) {
	f, err := os.Open(p)
	if err != nil {
		return
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func syncAll() {
	unix.Sync()
	unix.Sync()
}

// lazy: a task touching a few percent of a big image reads about that much
// of the store, and its first exec ends long before an eager copy would.
func (b *layerBench) lazy(ctx context.Context) error {
	b.logf("lazy: packing a %d MiB image layer...", b.l.ImageMB)
	src := filepath.Join(b.work, "img")
	if err := fillTree(filepath.Join(src, "data"), "f", b.l.ImageMB, 7); err != nil {
		return err
	}
	l, err := b.store.CreateLayerFromDir(ctx, "bench/img", 0, src)
	if err != nil {
		return err
	}
	os.RemoveAll(src)
	blob := b.store.BlobPath(l.Digest)
	dev, devOK := deviceOf(blob)
	task := lazyTask(b.l.ImageMB, b.l.TouchPercent)
	lz, err := b.lazyLeg(ctx, blob, dev, task, false)
	if err != nil {
		return err
	}
	eager, err := b.lazyLeg(ctx, blob, dev, task, true)
	if err != nil {
		return err
	}
	size := l.ErofsSize
	if devOK {
		b.rep.add(fmt.Sprintf("lazy: bytes read from the store, task touching %.0f%% of a %d MiB image", b.l.TouchPercent, b.l.ImageMB),
			100*float64(lz.read)/float64(size), "% of the image",
			fmt.Sprintf("%s read of %s (block device reads during create + first exec, cold cache); target ≤ 10 %%", humanMiB(lz.read), humanMiB(size)))
	} else {
		b.rep.add("lazy: bytes read from the store", 0, "%", "not measured: the store is on no block device in /proc/diskstats")
	}
	b.rep.add("lazy: create + first exec of the task, cold cache", ms(lz.total), "ms",
		fmt.Sprintf("create %.0f ms + task %.0f ms; layers mounted in place, read on demand", ms(lz.create), ms(lz.task)))
	b.rep.add("eager: copy the image, then create + first exec", ms(eager.total), "ms",
		fmt.Sprintf("copy %.0f ms (read + write + fsync of the whole image) + create %.0f ms + task %.0f ms; lazy is %.1f× faster",
			ms(eager.total-eager.create-eager.task), ms(eager.create), ms(eager.task), float64(eager.total)/float64(max(lz.total, 1))))
	return nil
}

// lazyTask is the lazy figure's task: it reads touchPercent of an image
// of imageMB files of 1 MiB (at least one), spread over the image.
func lazyTask(imageMB int, touchPercent float64) string {
	touch := int(float64(imageMB) * touchPercent / 100)
	if touch < 1 {
		touch = 1
	}
	var files []string
	step := imageMB / touch
	for i := 0; i < touch; i++ {
		files = append(files, fmt.Sprintf("/data/f%05d", i*step))
	}
	return "cat " + strings.Join(files, " ") + " > /dev/null"
}

// lazyTiming is one leg of the lazy figure: create + first exec of the
// task (and, eager, the copy before them), its create and its task alone,
// and the bytes read from the store's device meanwhile.
type lazyTiming struct {
	total, create, task time.Duration
	read                int64
}

// lazyLeg runs the task in a new sandbox on the image layer with a cold
// page cache for blob; eager first copies the whole image (with fsync), as
// a runtime without lazy layers would.
func (b *layerBench) lazyLeg(ctx context.Context, blob string, dev diskDev, task string, eager bool) (lazyTiming, error) {
	var lt lazyTiming
	syncAll()
	dropFileCache(blob)
	r0, _, _ := dev.sectors()
	t0 := time.Now()
	if eager {
		if err := copyFile(blob, filepath.Join(b.work, "eager.erofs")); err != nil {
			return lt, err
		}
	}
	tc := time.Now()
	sb, err := b.create(ctx, api.LayerAttachment{Layer: "bench/img"})
	if err != nil {
		return lt, err
	}
	defer b.c.Delete(context.WithoutCancel(ctx), sb.ID)
	tt := time.Now()
	lt.create = tt.Sub(tc)
	res, err := b.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: task})
	lt.task = time.Since(tt)
	if err != nil {
		return lt, err
	}
	if res.ExitCode != 0 {
		return lt, fmt.Errorf("task exited %d: %s", res.ExitCode, res.Stderr)
	}
	lt.total = time.Since(t0)
	r1, _, _ := dev.sectors()
	os.Remove(filepath.Join(b.work, "eager.erofs"))
	lt.read = (r1 - r0) * 512
	return lt, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// burst: many sandboxes over few workspaces on one base write each
// workspace once (as a layer), against unpacking a tarball per sandbox.
func (b *layerBench) burst(ctx context.Context) error {
	n, k := b.l.Burst, b.l.BurstWorkspaces
	b.logf("burst: %d sandboxes over %d workspaces of %d MiB...", n, k, b.l.WorkspaceMB)
	tars := make([]string, k)
	for i := range tars {
		tars[i] = filepath.Join(b.work, fmt.Sprintf("ws%03d.tar", i))
		if err := writeWorkspaceTarFile(tars[i], b.l.WorkspaceMB, i); err != nil {
			return err
		}
	}
	dev, ok := deviceOf(b.dataDir)
	if !ok {
		b.rep.add("burst: bytes written", 0, "MiB", "not measured: the data dir is on no block device in /proc/diskstats")
		return nil
	}
	warrenBytes, wTime, err := b.burstWarren(ctx, dev, tars, n)
	if err != nil {
		return err
	}
	unpackBytes, uTime, err := burstUnpack(ctx, dev, filepath.Join(b.work, "unpacked"), tars, n)
	if err != nil {
		return err
	}
	b.rep.add(fmt.Sprintf("burst of %d sandboxes over %d workspaces (%d MiB each): bytes written, warren", n, k, b.l.WorkspaceMB),
		float64(warrenBytes)/mib, "MiB", fmt.Sprintf("each workspace packed once as a layer, then %d creates; %.1f s", n, wTime.Seconds()))
	b.rep.add("burst: bytes written, unpacking the tarball per sandbox", float64(unpackBytes)/mib, "MiB",
		fmt.Sprintf("%d unpacks; %.1f s", n, uTime.Seconds()))
	if unpackBytes > 0 {
		b.rep.add("burst: fewer bytes written than unpacking per sandbox", 100*(1-float64(warrenBytes)/float64(unpackBytes)), "%",
			"DSec reports 57 % fewer; aim for more")
	}
	return nil
}

// burstWarren is warren's side of the burst figure: each workspace tarball
// of tars becomes a layer once, then n sandboxes stack them (sandbox i the
// workspace i mod len(tars)) and are deleted. It returns the bytes written
// to dev and the time until the last sandbox answered.
func (b *layerBench) burstWarren(ctx context.Context, dev diskDev, tars []string, n int) (int64, time.Duration, error) {
	syncAll()
	_, w0, _ := dev.sectors()
	t0 := time.Now()
	for i, p := range tars {
		if _, err := b.store.CreateLayerFromTar(ctx, fmt.Sprintf("bench/burst-%03d", i), 0, p); err != nil {
			return 0, 0, err
		}
	}
	ids, err := b.burstCreates(ctx, n, len(tars))
	wTime := time.Since(t0)
	syncAll()
	_, w1, _ := dev.sectors()
	for _, id := range ids {
		if id != "" {
			_, _ = b.c.Delete(context.WithoutCancel(ctx), id)
		}
	}
	if err != nil {
		return 0, 0, err
	}
	return (w1 - w0) * 512, wTime, nil
}

// burstCreates creates n sandboxes from o.Concurrency clients, sandbox i
// on the workspace layer i mod k, and checks that each sees its workspace:
// the ids indexed by sandbox ("" where a create failed), and the first
// error.
func (b *layerBench) burstCreates(ctx context.Context, n, k int) ([]string, error) {
	ids := make([]string, n)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	sem := make(chan struct{}, b.o.Concurrency)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := b.create(ctx, api.LayerAttachment{Layer: fmt.Sprintf("bench/burst-%03d", i%k)})
			if err == nil {
				ids[i] = sb.ID
				var r *api.ExecResult
				r, err = b.c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"ls", "/ws/src/m0000.py"}})
				if err == nil && r.ExitCode != 0 {
					err = fmt.Errorf("workspace missing in %s", sb.ID)
				}
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return ids, firstErr
}

// burstUnpack is the burst figure's baseline: the workspace tarball of
// each of n sandboxes unpacked into a directory of its own under base
// (sandbox i the tarball i mod len(tars)). It returns the bytes written to
// dev and the time the unpacks took, and removes base.
func burstUnpack(ctx context.Context, dev diskDev, base string, tars []string, n int) (int64, time.Duration, error) {
	syncAll()
	_, u0, _ := dev.sectors()
	t1 := time.Now()
	for i := 0; i < n; i++ {
		d := filepath.Join(base, fmt.Sprint(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 0, 0, err
		}
		f, err := os.Open(tars[i%len(tars)])
		if err != nil {
			return 0, 0, err
		}
		_, err = image.Unpack(ctx, f, d, image.Limits{})
		f.Close()
		if err != nil {
			return 0, 0, err
		}
	}
	uTime := time.Since(t1)
	syncAll()
	_, u1, _ := dev.sectors()
	os.RemoveAll(base)
	return (u1 - u0) * 512, uTime, nil
}

func writeWorkspaceTarFile(p string, mb, seed int) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, mib)
	tw := tar.NewWriter(bw)
	buf := make([]byte, 256<<10)
	for i := range buf {
		buf[i] = byte(i*31 + seed)
	}
	err = tw.WriteHeader(&tar.Header{Name: "ws/", Typeflag: tar.TypeDir, Mode: 0o755})
	if err == nil {
		err = tw.WriteHeader(&tar.Header{Name: "ws/src/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for i := 0; err == nil && i < mb*4; i++ {
		buf[0], buf[1], buf[2] = byte(i), byte(seed), byte(seed>>8)
		err = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("ws/src/m%04d.py", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(buf))})
		if err == nil {
			_, err = tw.Write(buf)
		}
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// upgrade: a toolkit shared by many workspaces is one layer; upgrading it
// packs exactly that layer, and every workspace picks it up at its next create.
func (b *layerBench) upgrade(ctx context.Context) error {
	n := b.l.UpgradeWorkspaces
	b.logf("upgrade: %d workspaces sharing one toolkit...", n)
	tk := filepath.Join(b.work, "tk")
	os.MkdirAll(filepath.Join(tk, "bin"), 0o755)
	os.WriteFile(filepath.Join(tk, "VERSION"), []byte("1\n"), 0o644)
	if _, err := b.store.CreateLayerFromDir(ctx, "bench/toolkit", 0, tk); err != nil {
		return err
	}
	t0 := time.Now()
	ws := filepath.Join(b.work, "ws")
	for i := 0; i < n; i++ {
		os.MkdirAll(filepath.Join(ws, "ws"), 0o755)
		os.WriteFile(filepath.Join(ws, "ws", "task"), []byte(fmt.Sprintf("task %d\n", i)), 0o644)
		if _, err := b.store.CreateLayerFromDir(ctx, fmt.Sprintf("bench/ws-%04d", i), 0, ws); err != nil {
			return err
		}
	}
	made := time.Since(t0)
	before := countBlobs(b.store.Dir())
	t1 := time.Now()
	os.WriteFile(filepath.Join(tk, "VERSION"), []byte("2\n"), 0o644)
	l2, err := b.store.CreateLayerFromDir(ctx, "bench/toolkit", 0, tk)
	if err != nil {
		return err
	}
	upgrade := time.Since(t1)
	after := countBlobs(b.store.Dir())
	// Any workspace now runs with the new toolkit, nothing else rebuilt.
	sb, err := b.create(ctx, api.LayerAttachment{Layer: fmt.Sprintf("bench/ws-%04d", n/2)},
		api.LayerAttachment{Layer: "bench/toolkit", Mount: "/opt/toolkit", Protected: true})
	if err != nil {
		return err
	}
	defer b.c.Delete(context.WithoutCancel(ctx), sb.ID)
	r, err := b.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "cat /opt/toolkit/VERSION /ws/task"})
	if err != nil {
		return err
	}
	if r.Stdout != fmt.Sprintf("2\ntask %d\n", n/2) {
		return fmt.Errorf("workspace with the upgraded toolkit saw %q", r.Stdout)
	}
	b.rep.add(fmt.Sprintf("upgrade a toolkit used by %d workspaces: layers re-packed", n), float64(after-before), "layers",
		fmt.Sprintf("toolkit@%d packed in %.0f ms; a monolithic image per workspace would rebuild %d images; the %d workspace layers took %.1f s to pack once",
			l2.Version, ms(upgrade), n, n, made.Seconds()))
	return nil
}

func countBlobs(storeDir string) int {
	m, _ := filepath.Glob(filepath.Join(storeDir, "blobs", "sha256", "*.erofs"))
	return len(m)
}
