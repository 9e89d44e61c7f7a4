package bus

// The bus's authentication and authorization: every part of warren
// connects with its own NKey (nats-server's own mechanism) and gets only
// the subjects its role needs.
//
//   - apiserver: everything except posing as an edge (it may not publish
//     heartbeats nor subscribe to the edges' subjects or inboxes). It is
//     the only role that may publish to warren.edge.>, so the scope
//     headers of a request an edge receives were set by an apiserver.
//   - edge <node>: subscribes to warren.edge.<node>.> and its own inbox
//     prefix only; publishes heartbeats, events, trajectory logs and
//     replies to apiservers; reaches the JetStream API and data subjects
//     of the buckets and streams an edge uses, never warren-iam.
//
// Each role has its own inbox prefix (nats.CustomInboxPrefix), so no part
// can subscribe to another's replies.
//
// An auth directory holds one seed file per role: apiserver.nk and
// edge-<node>.nk (mode 0600), and route.secret, the password the servers
// of a cluster route with. The server trusts the public keys of every
// seed file in it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Roles of the bus's credentials.
const (
	RoleAPIServer = "apiserver"
	RoleEdge      = "edge"
)

const (
	inboxAPIServer = "_INBOX_apiserver"
	inboxEdge      = "_INBOX_edge"
	routeUser      = "warren-route"
	routeSecret    = "route.secret"
)

// InboxPrefix is the reply-inbox prefix of a role's connections (node: the
// edge's node name).
func InboxPrefix(role, node string) string {
	if role == RoleEdge {
		return inboxEdge + "." + node
	}
	return inboxAPIServer
}

// SeedFile is the name of a role's seed file in an auth directory.
func SeedFile(role, node string) string {
	if role == RoleEdge {
		return "edge-" + node + ".nk"
	}
	return "apiserver.nk"
}

// Auth is the content of an auth directory.
type Auth struct {
	Dir       string
	apiserver string            // public key
	edges     map[string]string // node -> public key
	route     string            // route password
}

// EnsureAuth opens the auth directory dir, creating it and the seeds of the
// apiserver and of each of nodes that are missing. Several processes may
// call it at once (the servers of a cluster started together): a lock
// file orders them.
func EnsureAuth(dir string, nodes []string) (*Auth, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bus: auth dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("bus: auth dir: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("bus: lock auth dir: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	files := []string{SeedFile(RoleAPIServer, "")}
	for _, n := range nodes {
		if n == "" || strings.ContainsAny(n, ".*> /") {
			return nil, fmt.Errorf("bus: invalid node name %q", n)
		}
		files = append(files, SeedFile(RoleEdge, n))
	}
	for _, f := range files {
		if err := ensureSeed(filepath.Join(dir, f)); err != nil {
			return nil, err
		}
	}
	if err := ensureSecret(filepath.Join(dir, routeSecret)); err != nil {
		return nil, err
	}
	return LoadAuth(dir)
}

func ensureSeed(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return fmt.Errorf("bus: nkey: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return fmt.Errorf("bus: nkey: %w", err)
	}
	return writeSecretFile(path, append(seed, '\n'))
}

func ensureSecret(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("bus: route secret: %w", err)
	}
	return writeSecretFile(path, []byte(hex.EncodeToString(b)+"\n"))
}

func writeSecretFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("bus: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("bus: write %s: %w", path, err)
	}
	return nil
}

// LoadAuth reads the auth directory dir: the apiserver's seed, every
// edge-<node>.nk and the route secret.
func LoadAuth(dir string) (*Auth, error) {
	a := &Auth{Dir: dir, edges: map[string]string{}}
	pub, err := publicKeyOf(filepath.Join(dir, SeedFile(RoleAPIServer, "")))
	if err != nil {
		return nil, err
	}
	a.apiserver = pub
	matches, err := filepath.Glob(filepath.Join(dir, "edge-*.nk"))
	if err != nil {
		return nil, fmt.Errorf("bus: auth dir: %w", err)
	}
	for _, m := range matches {
		node := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "edge-"), ".nk")
		if a.edges[node], err = publicKeyOf(m); err != nil {
			return nil, err
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, routeSecret))
	if err != nil {
		return nil, fmt.Errorf("bus: route secret: %w", err)
	}
	a.route = strings.TrimSpace(string(b))
	return a, nil
}

func publicKeyOf(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("bus: credentials: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return "", fmt.Errorf("bus: credentials %s: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("bus: credentials %s: %w", path, err)
	}
	return pub, nil
}

// Nodes lists the nodes that have edge credentials.
func (a *Auth) Nodes() []string {
	var n []string
	for k := range a.edges {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// PublicKey is the public NKey of a role's credentials ("" if none).
func (a *Auth) PublicKey(role, node string) string {
	if role == RoleEdge {
		return a.edges[node]
	}
	return a.apiserver
}

// Path is the seed file of a role in the auth directory.
func (a *Auth) Path(role, node string) string { return filepath.Join(a.Dir, SeedFile(role, node)) }

// apply makes the server options require these credentials: no anonymous
// client, and the cluster's routes authenticated with the route secret.
func (a *Auth) apply(opts *server.Options) {
	opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: a.apiserver, Permissions: apiserverPermissions()})
	for node, pub := range a.edges {
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: pub, Permissions: edgePermissions(node)})
	}
	opts.NoAuthUser = ""
	opts.Cluster.Username, opts.Cluster.Password = routeUser, a.route
	for _, u := range opts.Routes {
		if u.User == nil {
			u.User = url.UserPassword(routeUser, a.route)
		}
	}
}

// edgeStreams are the JetStream streams (KV and object buckets included)
// an edge reaches.
func edgeStreams() []string {
	return []string{"KV_" + BucketSnapshots, "KV_" + BucketTrajectories, streamTrajectories,
		"OBJ_" + bucketTrajInputs, "KV_" + BucketLost, StreamEvents, "KV_" + BucketRoster, "KV_" + BucketDataPlane,
		"KV_" + BucketNetworkRules, "KV_" + BucketStorage}
}

func apiserverPermissions() *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{SubjectHeartbeat, inboxEdge + ".>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{">"},
			Deny: []string{subjectEdgePrefix + ">", inboxEdge + ".>", "_INBOX.>"}},
	}
}

func edgePermissions(node string) *server.Permissions {
	pub := []string{SubjectHeartbeat, SubjectEvents + ".>", subjectTrajPrefix + ">", inboxAPIServer + ".>",
		"$JS.API.INFO", "$JS.API.STREAM.NAMES", "$O." + bucketTrajInputs + ".>"}
	// The data-plane key and the network rules are read-only to edges
	// (apiservers write them).
	for _, b := range []string{BucketSnapshots, BucketTrajectories, BucketLost, BucketRoster, BucketStorage} {
		pub = append(pub, "$KV."+b+".>")
	}
	for _, s := range edgeStreams() {
		pub = append(pub, "$JS.API.*.*."+s, "$JS.API.*.*."+s+".>", "$JS.API.*.*.*."+s, "$JS.API.*.*.*."+s+".>",
			"$JS.ACK."+s+".>", "$JS.FC."+s+".>")
	}
	return &server.Permissions{
		// Apiservers make the streams (EnsureBuckets); an edge that could
		// remove and make one again could give it sources that copy
		// warren-iam's messages into it.
		Publish:   &server.SubjectPermission{Allow: pub, Deny: edgeStreamDeny},
		Subscribe: &server.SubjectPermission{Allow: []string{EdgeSubject(node) + ".>", InboxPrefix(RoleEdge, node) + ".>"}},
	}
}

var edgeStreamDeny = []string{"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
	"$JS.API.STREAM.RESTORE.>"}

// EnsureBuckets makes (with an apiserver's credentials) the buckets and
// streams edges use, which edges may open and use but not make, remove or
// reconfigure, and the data-plane key, which edges only read.
func (c *Conn) EnsureBuckets(ctx context.Context) error {
	for _, b := range []string{BucketSnapshots, BucketTrajectories, BucketNetworkRules, BucketStorage} {
		if _, err := c.Records(ctx, b); err != nil {
			return err
		}
	}
	if _, err := c.TrajectoryLog(ctx); err != nil {
		return err
	}
	if _, err := c.TrajectoryInputs(ctx); err != nil {
		return err
	}
	if _, err := c.OpenLost(ctx); err != nil {
		return err
	}
	if _, err := c.OpenEvents(ctx); err != nil {
		return err
	}
	if _, err := c.KeyValue(ctx, BucketRoster, 0); err != nil {
		return err
	}
	_, err := c.DataPlaneKey(ctx)
	return err
}

// ConnectOptions are the client options of a role's connection: its
// credentials (seed file) and its inbox prefix.
func ConnectOptions(seedFile, role, node string) ([]nats.Option, error) {
	if role != RoleAPIServer && role != RoleEdge {
		return nil, fmt.Errorf("bus: unknown role %q", role)
	}
	var opts []nats.Option
	if seedFile != "" {
		o, err := nats.NkeyOptionFromSeed(seedFile)
		if err != nil {
			return nil, fmt.Errorf("bus: nkey seed: %w", err)
		}
		opts = append(opts, o)
	}
	return append(opts, nats.CustomInboxPrefix(InboxPrefix(role, node))), nil
}
