// Package iam authenticates and authorizes API callers. Principals hold API
// tokens: random secrets shown once, of which only the SHA-256 is stored.
// Every token names its principal, a project and a role; projects nest to
// any depth, and a token reaches its project and everything below it.
// Everything lives in a JetStream KV bucket; each apiserver keeps the
// whole (small) bucket in memory and follows it with a watch, so checks
// never leave the process and a revocation reaches every replica at once.
package iam

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Bucket is the KV bucket holding tokens (hashed) and projects.
const Bucket = "warren-iam"

// TokenPrefix starts every warren API token.
const TokenPrefix = "wrn_"

// Limits.
const (
	MaxPrincipalName = 64
	MaxTokenLifetime = 10 * 365 * 24 * time.Hour
)

// ErrUnauthenticated means the token is unknown, revoked, expired or malformed.
var ErrUnauthenticated = errors.New("iam: invalid token")

// Principal is who a token speaks for, and where.
type Principal struct {
	Name      string     `json:"name"`
	Project   string     `json:"project"` // "" = the root: everything
	Role      string     `json:"role"`
	TokenID   string     `json:"token_id"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Admin reports whether p administers the whole cluster.
func (p *Principal) Admin() bool { return p.Project == "" && p.Role == api.RoleAdmin }

// InScope reports whether project is p's project or below it.
func (p *Principal) InScope(project string) bool { return Within(project, p.Project) }

// Within reports whether project is scope or one of its descendants.
func Within(project, scope string) bool { return sandboxspec.Within(project, scope) }

// Kinds of objects for Sees.
const (
	KindSandbox    = "sandbox"
	KindTrajectory = "trajectory"
	KindSnapshot   = "snapshot"
	KindLayer      = "layer"
	KindPool       = "pool"
	KindTemplate   = "template"
	KindCommand    = "command"
	KindEvent      = "event"
	KindProject    = "project"
	KindToken      = "token"
)

// Sees is warren's one ownership rule: whether p may see and use an
// object of kind owned by project owner. Every object records its project
// (a project is owned by itself, a token by its project) and every route
// asks this before it reads, uses, changes or lists one.
// A token reaches its own project and every project below it, never one
// above it or beside it (the rule of sandboxes since the first IAM).
// The one widening: layers are catalogs for the projects below. A layer
// of the root project (owner "", made by a root token) is the operator's
// shared catalog, like an image: every project may read and mount it; a
// layer of project p is read and mounted by p's descendants too (a name
// resolves to the project's own layer first, then its ancestors'). Only
// the owner's scope changes one (see Changes). Templates are catalogs in
// the same way.
func (p *Principal) Sees(kind, owner string) bool {
	if p == nil {
		return false
	}
	if (kind == KindLayer || kind == KindTemplate) && Within(p.Project, owner) {
		return true
	}
	return p.InScope(owner)
}

// Changes reports whether p may change or delete an object of kind owned
// by owner: it must see it, and the shared catalog is root's alone.
func (p *Principal) Changes(kind, owner string) bool {
	return p != nil && p.InScope(owner) && p.Sees(kind, owner)
}

// Can reports whether p's role allows role's actions.
func (p *Principal) Can(role string) bool { return rank(p.Role) >= rank(role) }

func rank(role string) int {
	switch role {
	case api.RoleAdmin:
		return 3
	case api.RoleMember:
		return 2
	case api.RoleViewer:
		return 1
	}
	return 0
}

// tokenRecord is stored under token.<sha256 hex>: the wire form of a token
// without its secret (Secret stays empty, so it is never stored).
type tokenRecord = api.Token

// IAM is the in-memory mirror of the bucket plus the operations on it.
type IAM struct {
	kv jetstream.KeyValue
	w  jetstream.KeyWatcher

	mu       sync.RWMutex
	tokens   map[string]*tokenRecord // hash -> token
	projects map[string]*projectRecord
	now      func() time.Time
}

type projectRecord struct {
	api.Project
	rev uint64
}

// Open opens (creating) the bucket and loads it.
func Open(ctx context.Context, conn *bus.Conn) (*IAM, error) {
	kv, err := conn.KeyValue(ctx, Bucket, 0)
	if err != nil {
		return nil, err
	}
	m := &IAM{kv: kv, tokens: map[string]*tokenRecord{}, projects: map[string]*projectRecord{}, now: time.Now}
	w, err := watchAll(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("iam: watch: %w", err)
	}
	m.w = w
	loaded := make(chan struct{})
	go func() {
		once := false
		for e := range w.Updates() {
			if e == nil {
				if !once {
					once = true
					close(loaded)
				}
				continue
			}
			m.apply(e)
		}
	}()
	select {
	case <-loaded:
	case <-ctx.Done():
		_ = w.Stop()
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		_ = w.Stop()
		return nil, errors.New("iam: the bucket did not load")
	}
	return m, nil
}

// Close stops following the bucket.
func (m *IAM) Close() {
	if m.w != nil {
		_ = m.w.Stop()
	}
}

func (m *IAM) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	del := e.Operation() != jetstream.KeyValuePut
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case strings.HasPrefix(key, "token."):
		h := key[len("token."):]
		if del {
			delete(m.tokens, h)
			return
		}
		t := new(tokenRecord)
		if json.Unmarshal(e.Value(), t) != nil {
			return
		}
		if t.ID == "" {
			t.ID = "tok_" + h[:16]
		}
		m.tokens[h] = t
	case strings.HasPrefix(key, "project."):
		id := key[len("project."):]
		if del {
			delete(m.projects, id)
			return
		}
		p := new(projectRecord)
		if json.Unmarshal(e.Value(), &p.Project) != nil {
			return
		}
		p.rev = e.Revision()
		m.projects[id] = p
	}
}

func hashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// NewToken makes a fresh random token.
func NewToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return TokenPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

func validTokenShape(tok string) bool {
	if !strings.HasPrefix(tok, TokenPrefix) || len(tok) < 20 || len(tok) > 128 {
		return false
	}
	for _, c := range tok[len(TokenPrefix):] {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// bootstrapKey marks that the cluster's first admin token exists.
const bootstrapKey = "bootstrap"

// Bootstrap makes sure the cluster has an admin token. The first caller on
// an empty cluster (an atomic create in the KV bucket decides, so of several
// apiservers starting together exactly one wins) registers a token and
// writes it to dataDir/admin-token (mode 0600); a token already in that file
// is kept (a new NATS store under an old data dir). Later callers return the
// token of their own admin-token file when it is valid, else "": the token
// lives only on the disk of the apiserver that made it.
func (m *IAM) Bootstrap(ctx context.Context, dataDir string) (string, error) {
	path := filepath.Join(dataDir, "admin-token")
	var fileTok string
	if b, err := os.ReadFile(path); err == nil {
		fileTok = strings.TrimSpace(string(b))
		if _, err := m.Authenticate(ctx, fileTok); err == nil {
			return fileTok, nil
		}
	}
	// The first apiserver of a cluster wins the bootstrap key. A freshly
	// formed JetStream cluster may not answer at first, and an answer may be
	// lost after the key was written: retry, and recognise our own write by
	// a nonce.
	var nb [12]byte
	_, _ = rand.Read(nb[:])
	nonce := m.now().UTC().Format(time.RFC3339) + " " + hex.EncodeToString(nb[:])
	won := false
	err := bus.RetryStartup(ctx, func(ctx context.Context) error {
		_, err := m.kv.Create(ctx, bootstrapKey, []byte(nonce))
		if err == nil {
			won = true
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		e, gerr := m.kv.Get(ctx, bootstrapKey)
		if gerr != nil {
			return gerr
		}
		won = string(e.Value()) == nonce
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("iam: bootstrap: %w", err)
	}
	if !won {
		return "", nil
	}
	tok := fileTok
	if !validTokenShape(tok) {
		tok = NewToken()
	}
	rec := &tokenRecord{Principal: "admin", Project: "", Role: api.RoleAdmin, CreatedAt: m.now().UTC(), CreatedBy: "bootstrap"}
	if err := bus.RetryStartup(ctx, func(ctx context.Context) error { return m.putToken(ctx, tok, rec) }); err != nil {
		return "", err
	}
	if tok != fileTok {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return "", fmt.Errorf("iam: write admin token: %w", err)
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("iam: write admin token: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return "", fmt.Errorf("iam: write admin token: %w", err)
		}
	}
	return tok, nil
}

func (m *IAM) putToken(ctx context.Context, tok string, rec *tokenRecord) error {
	h := hashToken(tok)
	if rec.ID == "" {
		rec.ID = "tok_" + h[:16]
	}
	b, _ := json.Marshal(rec)
	if _, err := m.kv.Create(ctx, "token."+h, b); err != nil {
		return fmt.Errorf("iam: store token: %w", err)
	}
	m.mu.Lock()
	m.tokens[h] = rec
	m.mu.Unlock()
	return nil
}

// Authenticate returns the principal a token speaks for.
func (m *IAM) Authenticate(_ context.Context, tok string) (*Principal, error) {
	if !validTokenShape(tok) {
		return nil, ErrUnauthenticated
	}
	h := hashToken(tok)
	m.mu.RLock()
	t := m.tokens[h]
	m.mu.RUnlock()
	if t == nil {
		return nil, ErrUnauthenticated
	}
	if t.ExpiresAt != nil && !m.now().Before(*t.ExpiresAt) {
		return nil, ErrUnauthenticated
	}
	if t.Project != "" && !m.projectExists(t.Project) {
		return nil, ErrUnauthenticated // its project was deleted
	}
	return &Principal{Name: t.Principal, Project: t.Project, Role: t.Role, TokenID: t.ID, ExpiresAt: t.ExpiresAt}, nil
}

func (m *IAM) projectExists(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.projects[id] != nil
}

func forbidden(format string, a ...any) error {
	return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf(format, a...)}
}

func invalid(format string, a ...any) error {
	return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(format, a...)}
}

func notFound(format string, a ...any) error {
	return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf(format, a...)}
}

func parentOf(id string) string {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		return id[:i]
	}
	return ""
}

// IdleCPU is the idle_cpu default of project: its own, else its nearest
// ancestor's; nil when none sets one.
func (m *IAM) IdleCPU(project string) *float64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for p := project; p != ""; p = parentOf(p) {
		if r := m.projects[p]; r != nil && r.IdleCPU != nil {
			v := *r.IdleCPU
			return &v
		}
	}
	return nil
}

// Limit is one ancestor's quota, for enforcement.
type Limit struct {
	Project string
	Quota   api.Quota
}

// Chain lists the quotas that bind a sandbox of project: its own, then
// each ancestor's, skipping those without limits.
func (m *IAM) Chain(project string) []Limit {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []Limit
	for p := project; p != ""; p = parentOf(p) {
		if r := m.projects[p]; r != nil && r.Quota != (api.Quota{}) {
			out = append(out, Limit{Project: p, Quota: r.Quota})
		}
	}
	return out
}

// effective is the tightest limit on each dimension from id upward.
func (m *IAM) effectiveLocked(id string) api.Quota {
	var q api.Quota
	for p := id; p != ""; p = parentOf(p) {
		r := m.projects[p]
		if r == nil {
			continue
		}
		if r.Quota.Sandboxes > 0 && (q.Sandboxes == 0 || r.Quota.Sandboxes < q.Sandboxes) {
			q.Sandboxes = r.Quota.Sandboxes
		}
		if r.Quota.CPU > 0 && (q.CPU == 0 || r.Quota.CPU < q.CPU) {
			q.CPU = r.Quota.CPU
		}
		if r.Quota.MemoryMB > 0 && (q.MemoryMB == 0 || r.Quota.MemoryMB < q.MemoryMB) {
			q.MemoryMB = r.Quota.MemoryMB
		}
		if r.Quota.StorageBytes > 0 && (q.StorageBytes == 0 || r.Quota.StorageBytes < q.StorageBytes) {
			q.StorageBytes = r.Quota.StorageBytes
		}
		if r.Quota.EgressRateMbit > 0 && (q.EgressRateMbit == 0 || r.Quota.EgressRateMbit < q.EgressRateMbit) {
			q.EgressRateMbit = r.Quota.EgressRateMbit
		}
		if r.Quota.IngressRateMbit > 0 && (q.IngressRateMbit == 0 || r.Quota.IngressRateMbit < q.IngressRateMbit) {
			q.IngressRateMbit = r.Quota.IngressRateMbit
		}
		if r.Quota.MaxConns > 0 && (q.MaxConns == 0 || r.Quota.MaxConns < q.MaxConns) {
			q.MaxConns = r.Quota.MaxConns
		}
	}
	return q
}

// checkQuotaFits refuses a quota above what the parent (and its ancestors) allow.
func checkQuotaFits(q, parent api.Quota, parentID string) error {
	if q.Sandboxes < 0 || q.CPU < 0 || q.MemoryMB < 0 || q.StorageBytes < 0 || q.CPU > 1e9 || q.MemoryMB > 1<<40 {
		return invalid("quota values must be zero (no own limit) or positive")
	}
	if q.EgressRateMbit < 0 || q.IngressRateMbit < 0 || q.EgressRateMbit > api.MaxEgressRateMbit || q.IngressRateMbit > api.MaxEgressRateMbit {
		return invalid("quota egress_rate_mbit and ingress_rate_mbit must be 0 (no own limit) to %d", api.MaxEgressRateMbit)
	}
	if q.MaxConns < 0 || q.MaxConns > api.MaxNetConns {
		return invalid("quota max_conns must be 0 (no own limit) to %d", api.MaxNetConns)
	}
	where := "its parent"
	if parentID != "" {
		where = "project " + parentID
	}
	if parent.Sandboxes > 0 && q.Sandboxes > parent.Sandboxes {
		return forbidden("quota of %d sandboxes exceeds the %d that %s allows", q.Sandboxes, parent.Sandboxes, where)
	}
	if parent.CPU > 0 && q.CPU > parent.CPU {
		return forbidden("quota of %g cores exceeds the %g that %s allows", q.CPU, parent.CPU, where)
	}
	if parent.MemoryMB > 0 && q.MemoryMB > parent.MemoryMB {
		return forbidden("quota of %d MiB exceeds the %d that %s allows", q.MemoryMB, parent.MemoryMB, where)
	}
	if parent.StorageBytes > 0 && q.StorageBytes > parent.StorageBytes {
		return forbidden("quota of %d storage bytes exceeds the %d that %s allows", q.StorageBytes, parent.StorageBytes, where)
	}
	if parent.EgressRateMbit > 0 && q.EgressRateMbit > parent.EgressRateMbit {
		return forbidden("quota of %d Mbit/s egress per sandbox exceeds the %d that %s allows", q.EgressRateMbit, parent.EgressRateMbit, where)
	}
	if parent.IngressRateMbit > 0 && q.IngressRateMbit > parent.IngressRateMbit {
		return forbidden("quota of %d Mbit/s ingress per sandbox exceeds the %d that %s allows", q.IngressRateMbit, parent.IngressRateMbit, where)
	}
	if parent.MaxConns > 0 && q.MaxConns > parent.MaxConns {
		return forbidden("quota of %d connections per sandbox exceeds the %d that %s allows", q.MaxConns, parent.MaxConns, where)
	}
	return nil
}

// CreateProject makes a subproject. The caller must administer the parent;
// the quota may not exceed what the parent's chain allows.
func (m *IAM) CreateProject(ctx context.Context, caller *Principal, req *api.CreateProjectRequest) (*api.Project, error) {
	if !sandboxspec.ValidProjectName(req.Name) {
		return nil, invalid("project name %q must be 1-32 of [a-z0-9-], starting and ending with a letter or digit", trunc(req.Name))
	}
	parent := req.Parent
	if parent == "" {
		parent = caller.Project
	}
	if parent != "" && !sandboxspec.ValidProject(parent) {
		return nil, invalid("parent %q is not a project id", trunc(parent))
	}
	if !caller.Sees(KindProject, parent) {
		return nil, forbidden("project %s is outside your project %s", parent, caller.Project)
	}
	if !caller.Can(api.RoleAdmin) {
		return nil, forbidden("creating projects needs the admin role")
	}
	id := req.Name
	if parent != "" {
		id = parent + "." + req.Name
	}
	if len(id) > sandboxspec.MaxProjectPath {
		return nil, invalid("project id would exceed %d bytes", sandboxspec.MaxProjectPath)
	}
	m.mu.RLock()
	pexists := parent == "" || m.projects[parent] != nil
	eff := m.effectiveLocked(parent)
	m.mu.RUnlock()
	if !pexists {
		return nil, notFound("project %s not found", parent)
	}
	if err := checkQuotaFits(req.Quota, eff, parent); err != nil {
		return nil, err
	}
	if v := req.IdleCPU; v != nil && (*v < 0 || *v > sandboxspec.MaxCPU || *v != *v) {
		return nil, invalid("idle_cpu must be between 0 and %d cores", sandboxspec.MaxCPU)
	}
	p := api.Project{ID: id, Parent: parent, Name: req.Name, Quota: req.Quota, IdleCPU: req.IdleCPU, CreatedAt: m.now().UTC(), CreatedBy: caller.Name}
	b, _ := json.Marshal(&p)
	rev, err := m.kv.Create(ctx, "project."+id, b)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("project %s exists", id)}
		}
		return nil, unavailable(err)
	}
	m.mu.Lock()
	m.projects[id] = &projectRecord{Project: p, rev: rev}
	m.mu.Unlock()
	return &p, nil
}

func unavailable(err error) error {
	return &api.Error{Code: api.CodeUnavailable, Message: "the IAM store is not available now: " + err.Error()}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Project returns a project the caller can see (its own, an ancestor's
// descendants are not visible: only its scope).
func (m *IAM) Project(caller *Principal, id string) (*api.Project, error) {
	if !sandboxspec.ValidProject(id) || !caller.Sees(KindProject, id) {
		return nil, notFound("project %s not found", trunc(id))
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	r := m.projects[id]
	if r == nil {
		return nil, notFound("project %s not found", id)
	}
	p := r.Project
	return &p, nil
}

// Projects lists the projects in the caller's scope.
func (m *IAM) Projects(caller *Principal) []api.Project {
	m.mu.RLock()
	out := []api.Project{}
	for id, r := range m.projects {
		if caller.Sees(KindProject, id) {
			out = append(out, r.Project)
		}
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// UpdateProject changes a project's quota. Only an admin above the project
// may (nobody raises their own quota), and the new quota must fit the
// parent's chain and stay above every child's own quota.
func (m *IAM) UpdateProject(ctx context.Context, caller *Principal, id string, req *api.UpdateProjectRequest) (*api.Project, error) {
	if !sandboxspec.ValidProject(id) || !caller.Sees(KindProject, id) {
		return nil, notFound("project %s not found", trunc(id))
	}
	if !caller.Can(api.RoleAdmin) || id == caller.Project {
		return nil, forbidden("changing the quota of %s needs the admin role in a project above it", id)
	}
	m.mu.RLock()
	r := m.projects[id]
	var cur projectRecord
	if r != nil {
		cur = *r
	}
	eff := m.effectiveLocked(parentOf(id))
	var childErr error
	for cid, c := range m.projects {
		if parentOf(cid) == id {
			if err := checkQuotaFits(c.Quota, req.Quota, id); err != nil {
				childErr = &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("subproject %s holds more: %v", cid, err.(*api.Error).Message)}
			}
		}
	}
	m.mu.RUnlock()
	if r == nil {
		return nil, notFound("project %s not found", id)
	}
	if err := checkQuotaFits(req.Quota, eff, parentOf(id)); err != nil {
		return nil, err
	}
	if childErr != nil {
		return nil, childErr
	}
	p := cur.Project
	p.Quota = req.Quota
	b, _ := json.Marshal(&p)
	rev, err := m.kv.Update(ctx, "project."+id, b, cur.rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, &api.Error{Code: api.CodeConflict, Message: "the project changed meanwhile; retry"}
		}
		return nil, unavailable(err)
	}
	m.mu.Lock()
	m.projects[id] = &projectRecord{Project: p, rev: rev}
	m.mu.Unlock()
	return &p, nil
}

// DeleteProject removes an empty project: no subprojects, no live
// sandboxes (inUse says). Its tokens stop working.
func (m *IAM) DeleteProject(ctx context.Context, caller *Principal, id string, inUse func(string) int) error {
	if !sandboxspec.ValidProject(id) || !caller.Sees(KindProject, id) {
		return notFound("project %s not found", trunc(id))
	}
	if !caller.Can(api.RoleAdmin) || id == caller.Project {
		return forbidden("deleting %s needs the admin role in a project above it", id)
	}
	m.mu.RLock()
	r := m.projects[id]
	var child string
	for cid := range m.projects {
		if parentOf(cid) == id {
			child = cid
		}
	}
	m.mu.RUnlock()
	if r == nil {
		return notFound("project %s not found", id)
	}
	if child != "" {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("project %s has subprojects (%s); delete them first", id, child)}
	}
	if n := inUse(id); n > 0 {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("project %s has %d live sandboxes; delete them first", id, n)}
	}
	if err := m.kv.Delete(ctx, "project."+id); err != nil {
		return unavailable(err)
	}
	m.mu.Lock()
	delete(m.projects, id)
	m.mu.Unlock()
	return nil
}

// CreateToken issues a token for a principal in the caller's scope with at
// most the caller's role, expiring no later than the caller's own token.
func (m *IAM) CreateToken(ctx context.Context, caller *Principal, req *api.CreateTokenRequest) (*api.Token, error) {
	if req.Principal == "" || len(req.Principal) > MaxPrincipalName || !printable(req.Principal) {
		return nil, invalid("principal must be 1-%d printable characters", MaxPrincipalName)
	}
	project := req.Project
	if project == "" {
		project = caller.Project
	}
	if project != "" && !sandboxspec.ValidProject(project) {
		return nil, invalid("project %q is not a project id", trunc(project))
	}
	role := req.Role
	if role == "" {
		role = api.RoleMember
	}
	if rank(role) == 0 {
		return nil, invalid("role must be admin, member or viewer")
	}
	if !caller.Sees(KindProject, project) {
		return nil, forbidden("project %s is outside your project %s", project, caller.Project)
	}
	if !caller.Can(api.RoleAdmin) {
		return nil, forbidden("issuing tokens needs the admin role")
	}
	if !caller.Can(role) {
		return nil, forbidden("role %s exceeds your role %s", role, caller.Role)
	}
	if project != "" && !m.projectExists(project) {
		return nil, notFound("project %s not found", project)
	}
	if req.ExpiresIn < 0 || time.Duration(req.ExpiresIn)*time.Second > MaxTokenLifetime {
		return nil, invalid("expires_in must be between 0 and %d seconds", int64(MaxTokenLifetime/time.Second))
	}
	now := m.now().UTC()
	var exp *time.Time
	if req.ExpiresIn > 0 {
		t := now.Add(time.Duration(req.ExpiresIn) * time.Second)
		exp = &t
	}
	if caller.ExpiresAt != nil && (exp == nil || exp.After(*caller.ExpiresAt)) {
		if req.ExpiresIn > 0 {
			return nil, forbidden("the token would outlive yours (which expires %s)", caller.ExpiresAt.Format(time.RFC3339))
		}
		t := *caller.ExpiresAt
		exp = &t
	}
	tok := NewToken()
	rec := &tokenRecord{Principal: req.Principal, Project: project, Role: role, CreatedAt: now, CreatedBy: caller.Name, ExpiresAt: exp}
	if err := m.putToken(ctx, tok, rec); err != nil {
		return nil, unavailable(err)
	}
	t := *rec
	t.Secret = tok
	return &t, nil
}

func printable(s string) bool {
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// Tokens lists the tokens the caller may manage (admins: those in scope;
// others: their own).
func (m *IAM) Tokens(caller *Principal) []api.Token {
	m.mu.RLock()
	out := []api.Token{}
	for _, t := range m.tokens {
		if t.ID == caller.TokenID || (caller.Can(api.RoleAdmin) && caller.Sees(KindToken, t.Project)) {
			out = append(out, *t)
		}
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// RevokeToken deletes a token: the caller's own, or one an admin's scope holds.
func (m *IAM) RevokeToken(ctx context.Context, caller *Principal, id string) error {
	m.mu.RLock()
	var hash string
	var rec *tokenRecord
	for h, t := range m.tokens {
		if t.ID == id {
			hash, rec = h, t
		}
	}
	m.mu.RUnlock()
	if rec == nil || !(rec.ID == caller.TokenID || (caller.Can(api.RoleAdmin) && caller.Sees(KindToken, rec.Project))) {
		return notFound("token %s not found", trunc(id))
	}
	if err := m.kv.Delete(ctx, "token."+hash); err != nil {
		return unavailable(err)
	}
	m.mu.Lock()
	delete(m.tokens, hash)
	m.mu.Unlock()
	return nil
}

// watchAll starts the bucket's watcher, trying again for up to 30 s: in a
// cluster whose NATS servers have just started (or are busy), creating the
// watcher's consumer can time out before the stream has a leader, and an
// apiserver that gave up then would not start at all.
func watchAll(ctx context.Context, kv jetstream.KeyValue) (jetstream.KeyWatcher, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, err := kv.WatchAll(context.Background())
		if err == nil || time.Now().After(deadline) {
			return w, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
