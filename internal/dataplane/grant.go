// Package dataplane carries the byte streams of sandbox operations (exec
// output, file and tar transfers) between an apiserver and an edge, off the
// control bus: one HTTP request per call to the edge's data listener
// (HTTP/1.1 from a pool; the listener takes HTTP/2 cleartext too), whose
// flow control reaches from the client's socket to the agent's pipe, and
// whose end (a closed connection, a reset stream) cancels the call on every
// hop.
//
// Only apiservers may use it: each request carries a grant, an HMAC-SHA256
// over the sandbox, the operation, the caller's project scope and an expiry,
// signed with a key that apiservers and edges share (bus.DataPlaneKey). The
// edge takes the scope from the grant, never from the request, and checks it
// exactly as for bus calls.
//
// An answer is a sequence of frames (frame.go): chunks of stdout, stderr or
// data, then exactly one done (the JSON result) or error frame. A body that
// ends without one of those is a broken stream, never a short success.
package dataplane

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// GrantTTL is how long a grant is valid: long enough for the request to
// reach the edge, short enough that a leaked one is soon useless. The
// transfer itself may last longer.
const GrantTTL = 30 * time.Second

// Grant allows one operation on one sandbox.
type Grant struct {
	Sandbox string `json:"sb"`
	Op      string `json:"op"`
	// Scope limits the call to sandboxes of this project and below, when
	// Scoped (an unscoped grant is an admin's or an internal caller's).
	Scope   string `json:"scope,omitempty"`
	Scoped  bool   `json:"scoped,omitempty"`
	Expires int64  `json:"exp"` // unix seconds
}

// ErrBadGrant is a grant that is malformed, forged or expired.
var ErrBadGrant = errors.New("dataplane: bad grant")

var b64 = base64.RawURLEncoding

// Sign encodes g with its signature under key.
func Sign(key []byte, g *Grant) string {
	b, _ := json.Marshal(g)
	p := b64.EncodeToString(b)
	return p + "." + b64.EncodeToString(mac(key, p))
}

// Verify checks tok's signature under key and its expiry at now.
func Verify(key []byte, tok string, now time.Time) (*Grant, error) {
	p, sig, ok := strings.Cut(tok, ".")
	if !ok || len(key) == 0 {
		return nil, ErrBadGrant
	}
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(key, p)) {
		return nil, ErrBadGrant
	}
	b, err := b64.DecodeString(p)
	if err != nil {
		return nil, ErrBadGrant
	}
	var g Grant
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, ErrBadGrant
	}
	if now.Unix() > g.Expires {
		return nil, fmt.Errorf("%w: expired", ErrBadGrant)
	}
	return &g, nil
}

func mac(key []byte, payload string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("warren-dataplane-v1\x00"))
	h.Write([]byte(payload))
	return h.Sum(nil)
}
