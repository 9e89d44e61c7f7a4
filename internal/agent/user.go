package agent

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/internal/agentproto"
)

// credential is a resolved sandbox user.
type credential struct {
	spec   string
	uid    uint32
	gid    uint32
	groups []uint32
	name   string
	home   string
}

// key identifies the credential for the warm shell pool.
func (c *credential) key() string {
	if c == nil {
		return ""
	}
	return c.spec
}

// resolveUser turns "name", "uid", "name:group" or "uid:gid" into a
// credential using the sandbox's /etc/passwd and /etc/group.
func resolveUser(root *fsRoot, spec string) (*credential, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return nil, errf(agentproto.ErrInvalid, "user %q: empty name", spec)
	}
	passwd, _ := root.readSmall("/etc/passwd")
	group, _ := root.readSmall("/etc/group")
	pw := parseColon(passwd, 7)
	gr := parseColon(group, 4)

	c := &credential{spec: spec, home: "/"}
	var found []string
	if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		c.uid = uint32(n)
		for _, e := range pw {
			if e[2] == userPart {
				found = e
				break
			}
		}
	} else {
		for _, e := range pw {
			if e[0] == userPart {
				found = e
				break
			}
		}
		if found == nil {
			return nil, errf(agentproto.ErrNotFound, "user %q not in /etc/passwd", userPart)
		}
		n, err := strconv.ParseUint(found[2], 10, 32)
		if err != nil {
			return nil, errf(agentproto.ErrInvalid, "user %q: bad uid in /etc/passwd", userPart)
		}
		c.uid = uint32(n)
	}
	if found != nil {
		c.name = found[0]
		if g, err := strconv.ParseUint(found[3], 10, 32); err == nil {
			c.gid = uint32(g)
		}
		if found[5] != "" {
			c.home = found[5]
		}
	}
	if hasGroup {
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			c.gid = uint32(n)
		} else {
			ok := false
			for _, e := range gr {
				if e[0] == groupPart {
					if n, err := strconv.ParseUint(e[2], 10, 32); err == nil {
						c.gid, ok = uint32(n), true
					}
					break
				}
			}
			if !ok {
				return nil, errf(agentproto.ErrNotFound, "group %q not in /etc/group", groupPart)
			}
		}
	}
	c.groups = []uint32{c.gid}
	if c.name != "" {
		for _, e := range gr {
			for _, m := range strings.Split(e[3], ",") {
				if m == c.name {
					if n, err := strconv.ParseUint(e[2], 10, 32); err == nil && uint32(n) != c.gid {
						c.groups = append(c.groups, uint32(n))
					}
				}
			}
		}
	}
	return c, nil
}

// parseColon splits colon-separated database lines with at least n fields.
func parseColon(b []byte, n int) [][]string {
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < n {
			continue
		}
		out = append(out, f)
	}
	return out
}
