package edgeproto

import (
	"crypto/rand"
	"encoding/base32"
	"regexp"
	"strings"
)

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// ValidNodeName reports whether name can be a node name.
func ValidNodeName(name string) bool { return nodeNameRE.MatchString(name) }

// NodeOf extracts the node name from a sandbox id, or "" if id is malformed.
func NodeOf(id string) string {
	if len(id) > 80 || !strings.HasPrefix(id, "sb-") {
		return ""
	}
	rest := id[3:]
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 || i == len(rest)-1 {
		return ""
	}
	node, random := rest[:i], rest[i+1:]
	if !ValidNodeName(node) {
		return ""
	}
	for _, c := range random {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return ""
		}
	}
	return node
}

// NewSandboxID makes a fresh id for node, sb-<node>-<random> (the random
// part has no '-'). The apiserver chooses ids so that creates are
// idempotent.
func NewSandboxID(node string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "sb-" + node + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// LostReason is the reason of a sandbox reported lost with its node.
func LostReason(node string) string {
	return "reported lost: its node " + node + " missed its heartbeats"
}

// SnapshotLayerName is the named layer that holds a snapshot's diff.
func SnapshotLayerName(id string) string { return "snap/" + id }
