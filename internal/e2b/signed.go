package e2b

// Signed file URLs (sandbox.downloadUrl / uploadUrl, e2b.md §4.6): the
// SDK signs "<path>:<read|write>:<username>:<envdAccessToken>[:<exp>]"
// with SHA-256 and puts the signature in the URL, which carries no
// sandbox id and no header. The front remembers the key that created or
// connected each sandbox through it, and finds the sandbox whose access
// token verifies the signature; the request then runs as that key. A link
// therefore works on the apiserver that created or connected the sandbox,
// until the sandbox is killed or that apiserver restarts (connect again to
// sign anew).
//
// Access tokens: each sandbox created or connected through the front gets
// an envd access token and a traffic access token of its own (E2B's
// secure sandboxes; warren gives them to every sandbox, secure or not, so
// envd is never open). A token is an HMAC of the sandbox id under this
// front's random secret, so it opens that sandbox only, for as long as
// this front remembers the key that created or connected it; the key
// itself is never handed back. The project's key is still accepted in
// X-Access-Token (it can do everything the token can, and more).

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	warren "github.com/warrenhq/warren/sdk/go"
)

// maxSignedSandboxes bounds the keys remembered (about 200 bytes each).
const maxSignedSandboxes = 100_000

// Access token kinds and prefixes.
const (
	envdTokenPrefix    = "wsat_" // envd: X-Access-Token, signed links
	trafficTokenPrefix = "wstt_" // a private sandbox's ports (host.go)
)

// keyTable is the key that created or connected each sandbox, and the
// secret its access tokens are made with.
type keyTable struct {
	secret  []byte // made once (newKeyTable)
	mu      sync.Mutex
	keys    map[string]string   // sandbox id -> key
	private map[string]struct{} // sandboxes whose ports need a key (host.go)
}

func newKeyTable() keyTable {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		panic(fmt.Sprintf("e2b: no randomness for access tokens: %v", err)) // crypto/rand does not fail on Linux
	}
	return keyTable{secret: secret}
}

// token is sandbox id's access token of a kind (a prefix above).
func (t *keyTable) token(prefix, id string) string {
	m := hmac.New(sha256.New, t.secret)
	m.Write([]byte(prefix))
	m.Write([]byte(id))
	return prefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// isAccessToken reports whether v has the shape of an access token (of
// any sandbox or kind), rather than of a key.
func isAccessToken(v string) bool {
	return strings.HasPrefix(v, envdTokenPrefix) || strings.HasPrefix(v, trafficTokenPrefix)
}

// keyFor is the key a request carrying v for sandbox id runs as: v
// itself when it is a key, the remembered key when v is id's access token
// of the kind prefix.
func (t *keyTable) keyFor(prefix, id, v string) (string, error) {
	v = strings.TrimSpace(v)
	if !isAccessToken(v) {
		return v, nil
	}
	if !hmac.Equal([]byte(v), []byte(t.token(prefix, id))) {
		return "", errors.New("this access token is not this sandbox's")
	}
	t.mu.Lock()
	key := t.keys[id]
	t.mu.Unlock()
	if key == "" {
		return "", errors.New("this server no longer knows the sandbox's token: connect to the sandbox (Sandbox.connect) through this server again")
	}
	return key, nil
}

// setPrivate marks sandbox id's ports as reached with a key only.
func (t *keyTable) setPrivate(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.private == nil {
		t.private = map[string]struct{}{}
	}
	if len(t.private) >= maxSignedSandboxes {
		for k := range t.private { // forget one at random (its ports then need a key anyway)
			delete(t.private, k)
			break
		}
	}
	t.private[id] = struct{}{}
}

func (t *keyTable) remember(id, key string) {
	key = strings.TrimSpace(key)
	if key == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keys == nil {
		t.keys = map[string]string{}
	}
	if _, ok := t.keys[id]; !ok && len(t.keys) >= maxSignedSandboxes {
		for k := range t.keys { // forget one at random
			delete(t.keys, k)
			break
		}
	}
	t.keys[id] = key
}

// isPrivate reports whether sandbox id's ports need a key or token.
func (t *keyTable) isPrivate(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.private[id]
	return ok
}

// public is the key remembered for sandbox id when its ports are public
// ("" when none, or when they need a key).
func (t *keyTable) public(id string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.private[id]; ok {
		return ""
	}
	return t.keys[id]
}

func (t *keyTable) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.keys, id)
	delete(t.private, id)
}

// signature is the SDK's signature of a file operation.
func signature(path, op, user, key, exp string) string {
	raw := path + ":" + op + ":" + user + ":" + key
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// match is the sandbox and key whose signature of op this request
// carries (only the sandbox named by E2b-Sandbox-Id when it is sent). The
// SDK signs with the sandbox's envd access token.
func (t *keyTable) match(r *http.Request, op string) (id, key string, ok bool) {
	q := r.URL.Query()
	sig, exp := q.Get("signature"), q.Get("signature_expiration")
	only := r.Header.Get(sandboxIDHeader)
	t.mu.Lock()
	defer t.mu.Unlock()
	for sid, k := range t.keys {
		if only != "" && sid != only {
			continue
		}
		if subtle.ConstantTimeCompare([]byte(signature(q.Get("path"), op, q.Get("username"), t.token(envdTokenPrefix, sid), exp)), []byte(sig)) == 1 {
			return sid, k, true
		}
	}
	return "", "", false
}

// isSigned reports whether r is a signed /files request.
func isSigned(r *http.Request) bool {
	return r.URL.Path == "/files" && r.URL.Query().Has("signature")
}

// signedCaller authorises a signed /files request, answering the error
// itself when it returns nil.
func (s *Server) signedCaller(w http.ResponseWriter, r *http.Request, op string) *envdCaller {
	if exp := r.URL.Query().Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "signature_expiration is not a unix time")
			return nil
		}
		if time.Now().Unix() > n {
			writeError(w, http.StatusUnauthorized, "the signature has expired")
			return nil
		}
	}
	id, key, ok := s.keys.match(r, op)
	if !ok {
		writeError(w, http.StatusUnauthorized, "invalid signature for this path and operation (or the sandbox was not created or connected through this server)")
		return nil
	}
	tok, err := TokenFromKey(key)
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return nil
	}
	return &envdCaller{id: id, c: warren.New(internalBase, tok, warren.WithHTTPClient(s.hc), warren.WithRetry(1, 0, 0)),
		cs: warren.New(internalBase, tok, warren.WithHTTPClient(s.streamHC), warren.WithRetry(1, 0, 0)), facts: &s.facts}
}
