// Package bus is the one place that knows NATS: the embedded server, subject
// names, the request/stream pattern between apiserver and edges, and the
// JetStream buckets. Everything else talks through its small API.
package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// MaxPayload is the largest message the bus carries. Bulk data is chunked
// well below it.
const MaxPayload = 8 << 20

// EmbeddedConfig configures the NATS server that `warren serve` runs in-process.
type EmbeddedConfig struct {
	DataDir string // JetStream storage lives in DataDir/nats
	// Listen, when set (host:port), also accepts external NATS clients
	// (other edges or apiservers). Empty: in-process connections only.
	Listen string
	Logger *slog.Logger

	// For `warren nats` (a development cluster on one machine): a server
	// name unique in the cluster, the cluster name, the address other
	// servers route to, and their route URLs (nats-route://host:port).
	ServerName    string
	ClusterName   string
	ClusterListen string
	Routes        []string
	Log           bool // write the server's own log to stderr

	// Auth is the credentials every client must present (see auth.go).
	// Without it the server refuses to start unless NoAuth is set (a
	// benchmark of authentication's cost).
	Auth   *Auth
	NoAuth bool

	// TLSCert and TLSKey, when set, make clients and routes speak TLS
	// (between hosts). TLSCA, when set too, is the CA that signs the other
	// servers' route certificates, which are then verified.
	TLSCert, TLSKey, TLSCA string
}

// Embedded is a running in-process NATS server with JetStream.
type Embedded struct {
	srv  *server.Server
	auth *Auth
}

// StartEmbedded starts NATS with JetStream on local disk.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Auth == nil && !cfg.NoAuth {
		return nil, errors.New("bus: a NATS server needs an auth directory (or NoAuth)")
	}
	storeDir := filepath.Join(cfg.DataDir, "nats")
	if err := os.MkdirAll(storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("bus: %w", err)
	}
	name := cfg.ServerName
	if name == "" {
		name = "warren-embedded"
	}
	opts := &server.Options{
		ServerName:         name,
		JetStream:          true,
		StoreDir:           storeDir,
		MaxPayload:         MaxPayload,
		NoSigs:             true,
		NoLog:              !cfg.Log,
		JetStreamMaxMemory: 256 << 20,
		MaxPending:         256 << 20,
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, err
		}
		opts.Host, opts.Port = host, port
	}
	if cfg.ClusterListen != "" {
		host, port, err := splitHostPort(cfg.ClusterListen)
		if err != nil {
			return nil, err
		}
		opts.Cluster.Name = cfg.ClusterName
		if opts.Cluster.Name == "" {
			opts.Cluster.Name = "warren"
		}
		opts.Cluster.Host, opts.Cluster.Port = host, port
		for _, r := range cfg.Routes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("bus: route %q is not a URL (nats-route://host:port)", r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	if cfg.Auth != nil {
		cfg.Auth.apply(opts)
	}
	if err := applyTLS(cfg, opts); err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bus: nats server: %w", err)
	}
	if cfg.Log {
		srv.ConfigureLogger()
	}
	go srv.Start()
	// A clustered server is ready for clients only once it meets its routes;
	// the caller waits for that (JetStream needs a quorum).
	if !srv.ReadyForConnections(60 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("bus: nats server did not become ready")
	}
	return &Embedded{srv: srv, auth: cfg.Auth}, nil
}

// Connect opens an in-process client connection with the credentials of
// role (node: the edge's node name).
func (e *Embedded) Connect(name, role, node string) (*Conn, error) {
	seed := ""
	if e.auth != nil {
		seed = e.auth.Path(role, node)
	}
	auth, err := ConnectOptions(seed, role, node)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect("", append([]nats.Option{nats.InProcessServer(e.srv), nats.Name(name),
		nats.MaxReconnects(-1), nats.ReconnectBufSize(64 << 20)}, auth...)...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect in-process: %w", err)
	}
	c, err := newConn(nc)
	if err != nil {
		return nil, err
	}
	c.edge = role == RoleEdge
	return c, nil
}

// ClientURL is the URL external clients use, or "" when not listening.
func (e *Embedded) ClientURL() string {
	if e.srv.Addr() == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

func splitHostPort(addr string) (string, int, error) {
	var host string
	var port int
	h, p, err := netSplit(addr)
	if err != nil {
		return "", 0, fmt.Errorf("bus: listen address %q: %w", addr, err)
	}
	host = h
	if _, err := fmt.Sscanf(p, "%d", &port); err != nil {
		return "", 0, fmt.Errorf("bus: listen port %q: %w", p, err)
	}
	return host, port, nil
}

// applyTLS makes the client port and the routes speak TLS.
func applyTLS(cfg EmbeddedConfig, opts *server.Options) error {
	if cfg.TLSCert == "" && cfg.TLSKey == "" {
		if cfg.TLSCA != "" {
			return errors.New("bus: a TLS CA needs the server's certificate and key too")
		}
		return nil
	}
	if cfg.TLSCert == "" || cfg.TLSKey == "" {
		return errors.New("bus: TLS needs both the certificate and the key")
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey})
	if err != nil {
		return fmt.Errorf("bus: tls: %w", err)
	}
	opts.TLSConfig, opts.TLS, opts.TLSTimeout = tc, true, 5
	if cfg.ClusterListen != "" {
		if cfg.TLSCA == "" {
			return errors.New("bus: TLS routes need the CA that signs the servers' certificates")
		}
		rc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey,
			CaFile: cfg.TLSCA, Verify: cfg.TLSCA != ""})
		if err != nil {
			return fmt.Errorf("bus: route tls: %w", err)
		}
		rc.RootCAs = rc.ClientCAs // a route is a client of the other server too
		opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = rc, 5
	}
	return nil
}
