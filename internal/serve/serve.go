// Package serve runs every part of warren on one machine: an embedded NATS
// server with JetStream, one edge, the watcher, placement and the apiserver.
// The parts talk over NATS exactly as they do in a cluster.
package serve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/runtime/container"
	"github.com/warrenhq/warren/internal/watcher"
)

// Options configure `warren serve`.
type Options struct {
	DataDir    string // default /var/lib/warren
	Listen     string // default 127.0.0.1:7070
	Node       string // default: hostname, sanitised
	AgentPath  string // default: warren-agent beside the running binary
	NATSListen string // optional: also accept external NATS clients here
	// CPUOvercommit and MemoryOvercommit scale the node's real capacity.
	CPUOvercommit    float64 // default 20
	MemoryOvercommit float64 // default 1.5
	// MinMemoryAvailableMB and MaxMemoryPressure: see edge.Config.
	MinMemoryAvailableMB int64
	MaxMemoryPressure    float64
	KeepOnShutdown       bool
	Logger               *slog.Logger
	// Ready, when set, is called once the API answers (with its URL and the admin token).
	Ready func(url, token string)
}

func (o *Options) defaults() error {
	if o.DataDir == "" {
		o.DataDir = "/var/lib/warren"
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	if o.Node == "" {
		o.Node = DefaultNodeName()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CPUOvercommit == 0 {
		o.CPUOvercommit = 20
	}
	if o.MemoryOvercommit == 0 {
		o.MemoryOvercommit = 1.5
	}
	if o.AgentPath == "" {
		p, err := FindAgent()
		if err != nil {
			return err
		}
		o.AgentPath = p
	}
	return nil
}

// FindAgent looks for warren-agent beside the running binary, then on PATH.
func FindAgent() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "warren-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, "warren-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("serve: warren-agent not found beside the warren binary or on PATH (build it with `make build`, or pass --agent)")
}

// DefaultNodeName derives a valid node name from the hostname.
func DefaultNodeName() string {
	h, _ := os.Hostname()
	out := make([]byte, 0, len(h))
	for _, c := range []byte(h) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			out = append(out, c)
		case c >= 'A' && c <= 'Z':
			out = append(out, c+'a'-'A')
		case c == '-' || c == '.' || c == '_':
			out = append(out, '-')
		}
		if len(out) == 32 {
			break
		}
	}
	name := string(out)
	for len(name) > 0 && name[len(name)-1] == '-' {
		name = name[:len(name)-1]
	}
	if !edge.ValidNodeName(name) {
		return "node"
	}
	return name
}

// CgroupParent is the cgroup under which the node started from dataDir
// keeps its sandboxes: one per data dir, so that several warren instances
// on one host (tests, benchmarks) never reconcile away each other's sandboxes.
func CgroupParent(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	h := sha256.Sum256([]byte(abs))
	return "warren/" + hex.EncodeToString(h[:6])
}

// Run serves until ctx is cancelled, then shuts down cleanly.
func Run(ctx context.Context, o Options) error {
	if err := o.defaults(); err != nil {
		return err
	}
	log := o.Logger
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("serve: data dir: %w", err)
	}
	// Bind the API port first, so a port conflict fails fast.
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("serve: listen %s: %w", o.Listen, err)
	}
	defer ln.Close()

	nats, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: o.DataDir, Listen: o.NATSListen, Logger: log})
	if err != nil {
		return err
	}
	defer nats.Shutdown()
	edgeConn, err := nats.Connect("warren-edge")
	if err != nil {
		return err
	}
	defer edgeConn.Close()
	apiConn, err := nats.Connect("warren-apiserver")
	if err != nil {
		return err
	}
	defer apiConn.Close()

	images, err := image.Open(filepath.Join(o.DataDir, "images"))
	if err != nil {
		return err
	}
	if _, err := images.EnsureBusybox(ctx); err != nil {
		log.Warn("cannot build the busybox image", "err", err)
	}
	writable, closeWritable, err := openWritable(ctx, o.DataDir, o.KeepOnShutdown, log)
	if err != nil {
		return err
	}
	defer closeWritable()

	rt, err := container.New(container.Config{AgentPath: o.AgentPath, Logger: log, CgroupParent: CgroupParent(o.DataDir)})
	if err != nil {
		return err
	}
	defer func() {
		if !o.KeepOnShutdown {
			if err := rt.Close(); err != nil {
				log.Warn("remove parent cgroup", "err", err)
			}
		}
	}()
	memMB := totalMemoryMB()
	e, err := edge.New(edge.Config{
		Node: o.Node, DataDir: o.DataDir, Bus: edgeConn, Runtime: rt,
		Images: imageResolver{store: images}, Writable: writable, Logger: log,
		CPUCapacity:    float64(goruntime.NumCPU()) * o.CPUOvercommit,
		MemoryMB:       int64(float64(memMB) * o.MemoryOvercommit),
		KeepOnShutdown: o.KeepOnShutdown,
		CPUOvercommit:  o.CPUOvercommit, MemoryOvercommit: o.MemoryOvercommit,
		MinMemoryAvailableMB: o.MinMemoryAvailableMB, MaxMemoryPressure: o.MaxMemoryPressure,
	})
	if err != nil {
		return err
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = e.Close(cctx)
	}()

	w, err := watcher.New(apiConn)
	if err != nil {
		return err
	}
	defer w.Close()
	auth, err := iam.Open(ctx, apiConn)
	if err != nil {
		return err
	}
	token, err := auth.Bootstrap(ctx, o.DataDir)
	if err != nil {
		return err
	}
	api, err := apiserver.New(ctx, apiserver.Config{Bus: apiConn, IAM: auth, Watcher: w, Logger: log})
	if err != nil {
		return err
	}
	if !w.WaitForNode(o.Node, 10*time.Second) {
		return errors.New("serve: the edge did not report in")
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	log.Info("warren is serving", "url", url, "node", o.Node, "data_dir", o.DataDir)
	if o.Ready != nil {
		o.Ready(url, token)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: http: %w", err)
		}
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

func totalMemoryMB() int64 {
	var si struct{}
	_ = si
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int64
	_, _ = fmt.Sscanf(string(b), "MemTotal: %d kB", &kb)
	return kb / 1024
}
