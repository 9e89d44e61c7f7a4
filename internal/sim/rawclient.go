package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/warrenhq/warren/api"
)

// rawClient is the lean load generator of the single-create phase: one
// keep-alive HTTP/1.1 connection, a request encoded once and written as
// is, and an answer checked by status and read by Content-Length without
// decoding it. The SDK's client (net/http, JSON both ways) costs the
// machine ~40 µs of CPU per create; this one a few, which leaves the
// shared cores to the control plane being measured.
type rawClient struct {
	addr string
	req  []byte
	conn net.Conn
	br   *bufio.Reader
}

func newRawClient(base, token string, spec api.CreateSandboxRequest) (*rawClient, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST /v1/sandboxes HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: %d\r\n\r\n",
		u.Host, token, len(body))
	b.Write(body)
	return &rawClient{addr: u.Host, req: b.Bytes()}, nil
}

// create makes one sandbox; it redials after any error.
func (c *rawClient) create() error {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 8192)
	}
	err := c.roundTrip()
	if err != nil {
		c.conn.Close()
		c.conn = nil
	}
	return err
}

func (c *rawClient) roundTrip() error {
	_ = c.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.conn.Write(c.req); err != nil {
		return err
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return err
	}
	// "HTTP/1.1 201 Created"
	if len(line) < 12 {
		return fmt.Errorf("malformed status line %q", line)
	}
	status := string(line[9:12])
	length := -1
	for {
		h, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		if k, v, ok := bytes.Cut(h, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return fmt.Errorf("bad Content-Length %q", v)
			}
		}
	}
	if length < 0 {
		return fmt.Errorf("answer without Content-Length")
	}
	if _, err := c.br.Discard(length); err != nil {
		return err
	}
	if status != "201" {
		return fmt.Errorf("create answered %s", status)
	}
	return nil
}

func (c *rawClient) close() {
	if c.conn != nil {
		c.conn.Close()
	}
}
