package apiserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
)

// Ports in (issue 16, item 6; docs/architecture.md, "Ports"). A request to
// /v1/sandboxes/{id}/ports/{port}/<path> is proxied, as HTTP/1.1 with
// streaming bodies both ways and upgrades (WebSocket), to <path> on the
// sandbox's loopback port: each request gets its own stream to the
// sandbox's node (edgeproto.OpPort over the data plane), which connects inside
// the sandbox's network namespace. The caller's token authorizes it (the
// edge checks the sandbox against the grant's scope, as for every
// sandbox route) and is not passed on. GET …/ports/{port}?raw=1 with
// "Upgrade: tcp" turns the connection into a raw TCP stream to the port
// (warren port-forward). A port made public is reached without a token at
// /p/<secret>/<path>.

// proxyMethods are the methods the port proxy answers (each a route: the
// spec lists every route).
var proxyMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

func portRoutes(s *Server) []route {
	rs := []route{
		{pattern: "GET /v1/sandboxes/{id}/ports/{port}", handler: s.portRaw},
		{pattern: "POST /v1/sandboxes/{id}/ports/{port}", handler: s.setPort},
		{pattern: "DELETE /v1/sandboxes/{id}/ports/{port}", handler: s.revokePort},
	}
	for _, m := range proxyMethods {
		rs = append(rs,
			route{pattern: m + " /v1/sandboxes/{id}/ports/{port}/{path...}", handler: s.proxyPort},
			route{pattern: m + " /p/{secret}/{path...}", handler: s.proxyPublic, public: true})
	}
	return rs
}

// portOf reads the {port} of r: 1 to 65535, else 400.
func portOf(r *http.Request) (int, error) {
	v := r.PathValue("port")
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 {
		return 0, &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("port %q is not a port number (1-65535)", truncate(v))}
	}
	return p, nil
}

// openPort opens a stream to port of sandbox id on its node, scoped to
// project (scoped false: unscoped, a root token's).
func (s *Server) openPort(ctx context.Context, id string, port int, project string, scoped bool) (*dataplane.Stream, error) {
	node, err := nodeOf(id)
	if err != nil {
		return nil, err
	}
	addr := s.dataAddr(node, edgeproto.OpPort)
	if addr == "" {
		if known, _ := s.cfg.Watcher.Known(node); !known {
			return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found (no node %s)", id, node)}
		}
		return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s of sandbox %s has no data listener, which ports need", node, id)}
	}
	req := fmt.Appendf(nil, `{"id":%q,"port":%d}`, id, port)
	st, err := s.data.Open(ctx, &dataplane.Call{Addr: addr, Sandbox: id, Op: edgeproto.OpPort, Scope: project, Scoped: scoped, Body: req})
	if errors.Is(err, dataplane.ErrUnreachable) {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s of sandbox %s is not available", node, id)}
	}
	return st, err
}

// callerScope is the scope of the caller's grants: its project, or none
// for a root token.
func callerScope(r *http.Request) (string, bool) {
	p := principal(r)
	return p.Project, p.Project != ""
}

// proxyPort proxies one HTTP request to a sandbox's port.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request) error {
	port, err := portOf(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	project, scoped := callerScope(r)
	s.proxyHTTP(w, r, id, port, project, scoped, restPath(r.URL.EscapedPath(), 5), true, nil)
	return nil
}

// restPath is the escaped path after its first skip segments ("/" at least).
func restPath(escaped string, skip int) string {
	segs := strings.SplitN(escaped, "/", skip+2) // "", then skip segments, then the rest
	if len(segs) < skip+2 {
		return "/"
	}
	return "/" + segs[skip+1]
}

// proxyHTTP forwards r to path on the sandbox's port through a stream of
// its own. stripAuth drops the Authorization header (the caller's warren
// token); fail, when set, may replace the answer to a failure.
func (s *Server) proxyHTTP(w http.ResponseWriter, r *http.Request, id string, port int, project string, scoped bool, path string, stripAuth bool, fail func(*api.Error) *api.Error) {
	prefix := strings.TrimSuffix(r.URL.EscapedPath(), strings.TrimPrefix(path, "/"))
	prefix = strings.TrimSuffix(prefix, "/")
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			// The stream outlives the dial: the transport closes it when
			// the request ends (or its caller goes away).
			octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			stop := context.AfterFunc(ctx, cancel)
			st, err := s.openPort(octx, id, port, project, scoped)
			if !stop() || err != nil {
				cancel()
				if st != nil {
					st.Close()
				}
				if err == nil {
					err = ctx.Err()
				}
				return nil, err
			}
			return st, nil
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
		// Proxy: nil: the sandbox is never reached through an HTTP proxy.
	}
	defer tr.CloseIdleConnections()
	target := &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			pr.Out.URL.RawPath = path
			if p, err := url.PathUnescape(path); err == nil {
				pr.Out.URL.Path = p
			} else {
				pr.Out.URL.Path, pr.Out.URL.RawPath = path, ""
			}
			if stripAuth {
				pr.Out.Header.Del("Authorization")
			}
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport:     tr,
		FlushInterval: -1, // streamed as it comes
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			ae := s.proxyError(err, id, port)
			if fail != nil {
				ae = fail(ae)
			}
			writeError(w, ae)
		},
	}
	rp.ServeHTTP(w, r)
}

// proxyError is the answer to a proxied request that failed.
func (s *Server) proxyError(err error, id string, port int) *api.Error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, context.Canceled):
		return &api.Error{Code: api.CodeBadRequest, Message: "request cancelled"}
	}
	return &api.Error{Code: api.CodeBadGateway, Message: fmt.Sprintf("port %d of sandbox %s: %v", port, id, err)}
}

// portRaw turns the connection into a raw TCP stream to the port (GET
// …/ports/{port}?raw=1, Connection: Upgrade, Upgrade: tcp); without raw it
// redirects to the port's root path.
func (s *Server) portRaw(w http.ResponseWriter, r *http.Request) error {
	port, err := portOf(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := s.ownSandbox(r.Context(), id); err != nil {
		return err
	}
	if r.URL.Query().Get("raw") != "1" {
		http.Redirect(w, r, r.URL.EscapedPath()+"/", http.StatusMovedPermanently)
		return nil
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "tcp") || !headerHas(r.Header, "Connection", "upgrade") {
		return &api.Error{Code: api.CodeBadRequest, Message: "a raw stream needs the headers Connection: Upgrade and Upgrade: tcp"}
	}
	project, scoped := callerScope(r)
	// The stream must not end with r's context: after the hijack, the
	// client's half close (an end of stream read through the server's
	// reader) cancels that context, while the other direction goes on.
	octx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	stop := context.AfterFunc(r.Context(), cancel)
	st, err := s.openPort(octx, id, port, project, scoped)
	if !stop() && err == nil {
		err = r.Context().Err()
	}
	if err != nil {
		return err
	}
	defer st.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return &api.Error{Code: api.CodeBadRequest, Message: "this connection cannot be upgraded: " + err.Error()}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"); err != nil {
		return nil
	}
	// What the server's reader already holds, then the connection itself
	// (not through the server's reader, whose end of stream cancels r's
	// context).
	var in io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		in = io.MultiReader(bytes.NewReader(b), conn)
	}
	spliceConns(conn, in, st)
	return nil
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// spliceConns copies between a client's connection (whose first bytes may
// sit in br) and a stream until both directions ended, passing each half
// close on.
func spliceConns(conn net.Conn, br io.Reader, st *dataplane.Stream) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(st, br); err != nil {
			st.Close()
			return
		}
		_ = st.CloseWrite()
	}()
	if _, err := io.Copy(conn, st); err != nil {
		conn.Close()
		st.Close()
	} else if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		conn.Close()
	}
	<-done
}

// publicRecord is a public port in BucketPorts.
type publicRecord struct {
	Hash    string    `json:"hash"`
	Sandbox string    `json:"sandbox"`
	Port    int       `json:"port"`
	Project string    `json:"project"`
	Created time.Time `json:"created"`
}

func secretHash(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

func bySandboxKey(id string, port int) string { return "s/" + id + "/" + strconv.Itoa(port) }

// ownSandbox checks that the caller may use sandbox id (the edge answers
// another project's as missing) and returns its project.
func (s *Server) ownSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := s.callEdge(ctx, id, edgeproto.OpGet, &edgeproto.IDRequest{ID: id}, &sb, nil); err != nil {
		return nil, err
	}
	return &sb, nil
}

// setPort makes a port public (a new secret URL, revoking the old) or
// private again.
func (s *Server) setPort(w http.ResponseWriter, r *http.Request) error {
	port, err := portOf(r)
	if err != nil {
		return err
	}
	var req api.PortRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.ownSandbox(r.Context(), id)
	if err != nil {
		return err
	}
	if err := s.dropPublic(r.Context(), id, port); err != nil {
		return err
	}
	out := api.Port{Sandbox: id, Port: port, Project: sb.Project}
	if !req.Public {
		writeJSON(w, http.StatusOK, &out)
		return nil
	}
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	secret := base64.RawURLEncoding.EncodeToString(raw[:])
	rec := publicRecord{Hash: secretHash(secret), Sandbox: id, Port: port, Project: sb.Project, Created: time.Now().UTC()}
	if err := s.ports.Put(r.Context(), "t/"+rec.Hash, &rec); err != nil {
		return storeUnavailable("the port store", err)
	}
	if err := s.ports.Put(r.Context(), bySandboxKey(id, port), &rec); err != nil {
		_ = s.ports.Delete(r.Context(), "t/"+rec.Hash)
		return storeUnavailable("the port store", err)
	}
	out.Public, out.Created = true, &rec.Created
	out.Path = "/p/" + secret + "/"
	out.URL = baseURL(r) + out.Path
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// revokePort makes a port private again (its public URL stops working).
func (s *Server) revokePort(w http.ResponseWriter, r *http.Request) error {
	port, err := portOf(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.ownSandbox(r.Context(), id)
	if err != nil {
		return err
	}
	if err := s.dropPublic(r.Context(), id, port); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &api.Port{Sandbox: id, Port: port, Project: sb.Project})
	return nil
}

// dropPublic removes the public URL of a port, if it has one.
func (s *Server) dropPublic(ctx context.Context, id string, port int) error {
	var rec publicRecord
	found, _, err := s.ports.Get(ctx, bySandboxKey(id, port), &rec)
	if err != nil {
		return storeUnavailable("the port store", err)
	}
	if !found {
		return nil
	}
	// The secret's record first: once it is gone the URL is dead.
	if err := s.ports.Delete(ctx, "t/"+rec.Hash); err != nil {
		return storeUnavailable("the port store", err)
	}
	if err := s.ports.Delete(ctx, bySandboxKey(id, port)); err != nil {
		return storeUnavailable("the port store", err)
	}
	return nil
}

// baseURL is the API's URL as the caller reached it.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "https" || p == "http" {
		scheme = p
	}
	return scheme + "://" + r.Host
}

// proxyPublic proxies a request to a public port: no token, the port's
// project's scope (a sandbox that is gone, or a revoked secret, is 404).
func (s *Server) proxyPublic(w http.ResponseWriter, r *http.Request) error {
	secret := r.PathValue("secret")
	missing := &api.Error{Code: api.CodeNotFound, Message: "no such public port (revoked, or its sandbox is gone)"}
	if len(secret) != 43 {
		return missing
	}
	var rec publicRecord
	found, _, err := s.ports.Get(r.Context(), "t/"+secretHash(secret), &rec)
	if err != nil {
		return storeUnavailable("the port store", err)
	}
	if !found {
		return missing
	}
	// A sandbox that ended takes its public URLs with it (ids are never
	// reused; the records go at their first use after its end).
	fail := func(ae *api.Error) *api.Error {
		if ae.Code != api.CodeNotFound && (ae.Code != api.CodeConflict || !s.sandboxEnded(r.Context(), rec.Sandbox, rec.Project)) {
			return ae
		}
		if err := s.dropPublic(context.WithoutCancel(r.Context()), rec.Sandbox, rec.Port); err != nil {
			s.log.Warn("drop the public port of an ended sandbox", "sandbox", rec.Sandbox, "port", rec.Port, "err", err)
		}
		return missing
	}
	s.proxyHTTP(w, r, rec.Sandbox, rec.Port, rec.Project, true, restPath(r.URL.EscapedPath(), 2), false, fail)
	return nil
}

// sandboxEnded reports whether sandbox id (of project) has ended: stopped,
// failed or lost (its tombstone answers 409 for a while).
func (s *Server) sandboxEnded(ctx context.Context, id, project string) bool {
	ctx = context.WithValue(ctx, principalKey{}, &iam.Principal{Role: api.RoleViewer, Project: project})
	sb, err := s.ownSandbox(ctx, id)
	if err != nil {
		var ae *api.Error
		return errors.As(err, &ae) && ae.Code == api.CodeNotFound
	}
	switch sb.State {
	case api.StateStopped, api.StateFailed, api.StateLost:
		return true
	}
	return false
}
