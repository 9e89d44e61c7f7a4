package api

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Name grammars both sides of the wire check: the apiserver before it
// routes a request, the node (internal/image) before it stores anything.

// ErrInvalid wraps malformed layer names, references and versions
// (internal/image's ErrInvalid is the same error).
var ErrInvalid = errors.New("invalid")

// MaxLayerVersion bounds version numbers.
const MaxLayerVersion = 1 << 30

const maxImageName = 200

// ValidImageName reports whether name can name an image: 1 to 200
// characters of [A-Za-z0-9._-/:@], starting with a letter or digit,
// without "..", "//" or a trailing "/".
func ValidImageName(name string) error {
	if name == "" || len(name) > maxImageName {
		return fmt.Errorf("image: invalid name %q: length must be 1..%d", name, maxImageName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == '/' || c == ':' || c == '@'
		if !ok {
			return fmt.Errorf("image: invalid name %q: character %q not allowed", name, c)
		}
	}
	c := name[0]
	if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
		return fmt.Errorf("image: invalid name %q: must start with a letter or digit", name)
	}
	if strings.Contains(name, "..") || strings.Contains(name, "//") || strings.HasSuffix(name, "/") {
		return fmt.Errorf("image: invalid name %q", name)
	}
	return nil
}

// ValidLayerName checks a layer name: 1 to 128 characters, segments of
// [a-z0-9._-] starting with a letter or digit, joined by "/".
//
// A name may be qualified by its project, "~<project>/<name>" (see
// QualifiedLayerName): names are per project.
func ValidLayerName(name string) error {
	if project, rest, ok := cutQualified(name); ok {
		if !validProjectID(project) {
			return fmt.Errorf("%w: layer name %q: %q is not a project", ErrInvalid, truncName(name), truncName(project))
		}
		return validPlainLayerName(rest)
	}
	return validPlainLayerName(name)
}

func validPlainLayerName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("%w: layer name %q: length must be 1..128", ErrInvalid, truncName(name))
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" {
			return fmt.Errorf("%w: layer name %q: empty segment", ErrInvalid, truncName(name))
		}
		c := seg[0]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fmt.Errorf("%w: layer name %q: each segment must start with a lower-case letter or digit", ErrInvalid, truncName(name))
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf("%w: layer name %q: character %q not allowed (use a-z, 0-9, '.', '_', '-', '/')", ErrInvalid, truncName(name), c)
			}
		}
	}
	if strings.Contains(name, "..") {
		return fmt.Errorf("%w: layer name %q: '..' not allowed", ErrInvalid, truncName(name))
	}
	return nil
}

// QualifiedLayerName is the store's name for layer name of project:
// "~<project>/<name>", or name itself for the root project (whose layers
// are the shared catalog, like every layer made before names were per
// project). Layer names are unique per project: p1 and p2 may each have
// their own ws/calc.
func QualifiedLayerName(project, name string) string {
	if project == "" {
		return name
	}
	return "~" + project + "/" + name
}

// SplitLayerName splits a store name into its project ("" for the root
// project) and the name its project uses.
func SplitLayerName(stored string) (project, name string) {
	if project, rest, ok := cutQualified(stored); ok {
		return project, rest
	}
	return "", stored
}

func cutQualified(name string) (project, rest string, ok bool) {
	q, ok := strings.CutPrefix(name, "~")
	if !ok {
		return "", "", false
	}
	project, rest, _ = strings.Cut(q, "/")
	return project, rest, true
}

// validProjectID is sandboxspec.ValidProject's grammar: names of a-z, 0-9
// and '-' joined by '.'.
func validProjectID(id string) bool {
	if id == "" || len(id) > 512 {
		return false
	}
	for _, seg := range strings.Split(id, ".") {
		if seg == "" || seg[0] == '-' || seg[len(seg)-1] == '-' {
			return false
		}
		for i := 0; i < len(seg); i++ {
			if c := seg[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func truncName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// ParseLayerRef splits "name" or "name@version" (version 0 = latest).
func ParseLayerRef(ref string) (string, int, error) {
	name, v, hasV := strings.Cut(ref, "@")
	if err := ValidLayerName(name); err != nil {
		return "", 0, err
	}
	if !hasV {
		return name, 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxLayerVersion || strconv.Itoa(n) != v {
		return "", 0, fmt.Errorf("%w: layer reference %q: version must be a positive integer", ErrInvalid, truncName(ref))
	}
	return name, n, nil
}
