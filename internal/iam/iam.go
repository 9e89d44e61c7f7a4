// Package iam authenticates API callers. Tokens are random secrets shown
// once; only their SHA-256 is stored (JetStream KV). This first version has
// one principal, the bootstrap admin; projects and quotas build on it.
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
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/internal/bus"
)

// Bucket is the KV bucket holding token hashes.
const Bucket = "warren-iam"

// TokenPrefix starts every warren API token.
const TokenPrefix = "wrn_"

// ErrUnauthenticated means the token is unknown, revoked or malformed.
var ErrUnauthenticated = errors.New("iam: invalid token")

// Principal is who a token belongs to.
type Principal struct {
	Name  string `json:"name"`
	Admin bool   `json:"admin"`
}

// IAM checks tokens against the KV bucket, with an in-memory cache.
type IAM struct {
	kv    jetstream.KeyValue
	cache sync.Map // hash -> *Principal
}

// Open opens (creating) the bucket.
func Open(ctx context.Context, conn *bus.Conn) (*IAM, error) {
	kv, err := conn.KeyValue(ctx, Bucket, 0)
	if err != nil {
		return nil, err
	}
	return &IAM{kv: kv}, nil
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
	if _, err := m.kv.Create(ctx, bootstrapKey, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return "", nil
		}
		return "", fmt.Errorf("iam: bootstrap: %w", err)
	}
	tok := fileTok
	if !strings.HasPrefix(tok, TokenPrefix) || len(tok) < 20 || len(tok) > 128 {
		tok = NewToken()
	}
	if err := m.store(ctx, tok, &Principal{Name: "admin", Admin: true}); err != nil {
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

func (m *IAM) store(ctx context.Context, tok string, p *Principal) error {
	b, _ := json.Marshal(p)
	if _, err := m.kv.Put(ctx, "token."+hashToken(tok), b); err != nil {
		return fmt.Errorf("iam: store token: %w", err)
	}
	return nil
}

// Authenticate returns the principal a token belongs to.
func (m *IAM) Authenticate(ctx context.Context, tok string) (*Principal, error) {
	if !strings.HasPrefix(tok, TokenPrefix) || len(tok) > 128 {
		return nil, ErrUnauthenticated
	}
	h := hashToken(tok)
	if p, ok := m.cache.Load(h); ok {
		return p.(*Principal), nil
	}
	e, err := m.kv.Get(ctx, "token."+h)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, ErrUnauthenticated
		}
		return nil, fmt.Errorf("iam: %w", err)
	}
	p := new(Principal)
	if err := json.Unmarshal(e.Value(), p); err != nil {
		return nil, fmt.Errorf("iam: corrupt principal: %w", err)
	}
	m.cache.Store(h, p)
	return p, nil
}
