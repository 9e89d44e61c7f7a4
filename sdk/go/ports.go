package warren

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenhq/warren/api"
)

// Ports: a process listening on a port inside a sandbox (on its loopback;
// a sandbox without a network too) is reachable through the API.

// PortURL is the URL of a sandbox's port through the API: requests to it
// (and below it) need the client's token in an Authorization header,
// which the API does not pass on to the sandbox.
func (c *Client) PortURL(id string, port int) string {
	return c.URL() + "/v1/sandboxes/" + esc(id) + "/ports/" + strconv.Itoa(port) + "/"
}

// ExposePort makes a sandbox's port public: the answer's URL reaches it
// without a token, until UnexposePort (or the sandbox's end). Each call
// makes a new URL and revokes the one before.
func (c *Client) ExposePort(ctx context.Context, id string, port int) (*api.Port, error) {
	return c.setPort(ctx, id, port, true)
}

// UnexposePort revokes a port's public URL.
func (c *Client) UnexposePort(ctx context.Context, id string, port int) (*api.Port, error) {
	var p api.Port
	if _, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: portPath(id, port)}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func (c *Client) setPort(ctx context.Context, id string, port int, public bool) (*api.Port, error) {
	var p api.Port
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: portPath(id, port), json: api.PortRequest{Public: public}}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func portPath(id string, port int) string {
	return "/v1/sandboxes/" + esc(id) + "/ports/" + strconv.Itoa(port)
}

// PortConn is a raw TCP stream to a sandbox's port through the API.
type PortConn struct {
	net.Conn
	br *bufio.Reader
}

// Read reads what the sandbox's side sent.
func (p *PortConn) Read(b []byte) (int, error) { return p.br.Read(b) }

// CloseWrite ends what goes to the sandbox: its side reads an end of
// stream, and may still answer.
func (p *PortConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("warren: this connection cannot be half closed")
}

// DialPort opens a raw TCP stream to port of sandbox id: an HTTP upgrade
// (GET …/ports/{port}?raw=1, Connection: Upgrade, Upgrade: tcp) on a
// connection of its own. Errors before the upgrade are *APIError (a 502
// when nothing listens on the port).
func (c *Client) DialPort(ctx context.Context, id string, port int) (*PortConn, error) {
	u, err := url.Parse(c.URL())
	if err != nil {
		return nil, fmt.Errorf("warren: %w", err)
	}
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			host += ":443"
		} else {
			host += ":80"
		}
	}
	var conn net.Conn
	var d net.Dialer
	if u.Scheme == "https" {
		conn, err = (&tls.Dialer{NetDialer: &d, Config: &tls.Config{ServerName: u.Hostname()}}).DialContext(ctx, "tcp", host)
	} else {
		conn, err = d.DialContext(ctx, "tcp", host)
	}
	if err != nil {
		return nil, fmt.Errorf("warren: dial %s: %w", host, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req, err := http.NewRequest(http.MethodGet, c.URL()+portPath(id, port)+"?raw=1", nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("warren: %w", err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	req.Header.Set("User-Agent", UserAgent)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("warren: port %d of %s: %w", port, id, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("warren: port %d of %s: %w", port, id, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		e := readError(resp)
		conn.Close()
		return nil, e
	}
	if !stop() { // ctx ended meanwhile: conn is closed
		return nil, ctx.Err()
	}
	return &PortConn{Conn: conn, br: br}, nil
}
