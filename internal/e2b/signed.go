package e2b

// Signed file URLs (sandbox.downloadUrl / uploadUrl, e2b.md §4.6): the
// SDK signs "<path>:<read|write>:<username>:<envdAccessToken>[:<exp>]"
// with SHA-256 and puts the signature in the URL, which carries no
// sandbox id and no header. The front remembers the access token it gave
// for each sandbox created or connected through it (the caller's key),
// and finds the sandbox whose token verifies the signature; the request
// then runs as that key. A link therefore works on the apiserver that
// created or connected the sandbox, until the sandbox is killed or that
// apiserver restarts (connect again to sign anew).

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	warren "github.com/warrenhq/warren/sdk/go"
)

// maxSignedSandboxes bounds the access tokens remembered.
const maxSignedSandboxes = 10_000

// keyTable is the access token given for each sandbox.
type keyTable struct {
	mu      sync.Mutex
	keys    map[string]string   // sandbox id -> key
	private map[string]struct{} // sandboxes whose ports need a key (host.go)
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
// carries (only the sandbox named by E2b-Sandbox-Id when it is sent).
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
		if subtle.ConstantTimeCompare([]byte(signature(q.Get("path"), op, q.Get("username"), k, exp)), []byte(sig)) == 1 {
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
