package e2b

// Sandbox hosts (sandbox.getHost(port), e2b.md §1): the SDKs name a
// sandbox's port "<port>-<sandboxID>.<domain>", the domain being the API's
// domain field or E2B_DOMAIN. With E2B_DOMAIN naming warren's E2B listener
// (wildcard DNS *.<domain> pointing at it), a request whose Host is such
// a name is proxied to that port through the native port proxy
// (/v1/sandboxes/{id}/ports/{port}/…: streamed both ways, upgrades
// included). The SDKs build the URL with https, so a deployment puts a TLS
// terminator with a wildcard certificate in front; plain http works
// where the client builds the URL itself. Port 49983 is envd itself, as
// the SDKs reach it without E2B_SANDBOX_URL.
//
// Authorization: as E2B's public sandbox traffic, a port is reached
// without a key, running as the key that created or connected the sandbox
// through this front (remembered, as for signed URLs); a request may
// instead carry the sandbox's traffic access token (signed.go) or a key
// in e2b-traffic-access-token, which a sandbox created with
// network.allowPublicTraffic false requires (its trafficAccessToken opens
// that sandbox's ports only). Neither is passed on to the sandbox.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

const (
	// envdPort is the port the SDKs reach envd at by host.
	envdPort = 49983
	// trafficTokenHeader carries a key for a sandbox's port (E2B's name).
	trafficTokenHeader = "E2b-Traffic-Access-Token"
	// maxProxyError bounds the native error body rewritten in E2B's shape.
	maxProxyError = 64 << 10
)

// portHost reads "<port>-<sandboxID>.<domain>": ok only for such a host.
func portHost(host string) (port int, id string, ok bool) {
	label, rest, dot := strings.Cut(host, ".")
	if !dot || rest == "" {
		return 0, "", false
	}
	ps, id, dash := strings.Cut(label, "-")
	if !dash || id == "" || len(ps) > 5 {
		return 0, "", false
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return 0, "", false
	}
	return port, id, true
}

// serveHost serves a request to a sandbox's host; false when r is not one.
func (s *Server) serveHost(w http.ResponseWriter, r *http.Request) bool {
	port, id, ok := portHost(r.Host)
	if !ok {
		return false
	}
	if port == envdPort {
		if r.Header.Get(sandboxIDHeader) == "" {
			r.Header.Set(sandboxIDHeader, id)
		}
		s.envd.ServeHTTP(w, r)
		return true
	}
	s.proxyPort(w, r, port, id)
	return true
}

// proxyPort forwards r to port of sandbox id through the native proxy.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, port int, id string) {
	key, err := s.keys.keyFor(trafficTokenPrefix, id, r.Header.Get(trafficTokenHeader))
	if err != nil {
		writeError(w, http.StatusUnauthorized, fmt.Sprintf("sandbox %s: %s: %v", id, trafficTokenHeader, err))
		return
	}
	if key == "" {
		key = s.keys.public(id)
	}
	if key == "" {
		writeError(w, http.StatusUnauthorized, fmt.Sprintf("sandbox %s: its ports need its trafficAccessToken in the %s header (network.allowPublicTraffic false), or are public through the front that created or connected it (Sandbox.connect first)", id, trafficTokenHeader))
		return
	}
	tok, err := TokenFromKey(key)
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	c := warren.New(internalBase, tok, warren.WithHTTPClient(s.hc), warren.WithRetry(1, 0, 0))
	if _, err := c.Get(r.Context(), id); err != nil {
		s.writeErr(w, "sandbox host", err)
		return
	}
	base := "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", strings.TrimPrefix(internalBase, "http://")
			pr.Out.URL.Path = base + pr.In.URL.Path
			pr.Out.URL.RawPath = base + pr.In.URL.EscapedPath()
			pr.Out.Host = pr.In.Host // the server in the sandbox sees its own name
			pr.Out.Header.Del(trafficTokenHeader)
			pr.Out.Header.Set("Authorization", "Bearer "+tok)
		},
		Transport:      s.liveClient().Transport,
		FlushInterval:  -1,
		ModifyResponse: func(resp *http.Response) error { return e2bProxyError(resp, id, port) },
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("port %d of sandbox %s: %v", port, id, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// e2bProxyError rewrites the native proxy's own failure (a closed port, an
// unreachable node: 502 or 503 with warren's error body) in E2B's shape;
// any other answer is the sandbox's and passes as it is.
func e2bProxyError(resp *http.Response, id string, port int) error {
	if resp.StatusCode != http.StatusBadGateway && resp.StatusCode != http.StatusServiceUnavailable {
		return nil
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), contentJSON) || resp.ContentLength < 0 || resp.ContentLength > maxProxyError {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxProxyError))
	resp.Body.Close()
	if err != nil {
		return err
	}
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return nil
	}
	out, _ := json.Marshal(struct {
		Error
		SandboxID string `json:"sandboxId"`
		Port      int    `json:"port"`
	}{Error{Code: resp.StatusCode, Message: eb.Error.Message}, id, port})
	out = append(out, '\n')
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
	resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
	return nil
}
