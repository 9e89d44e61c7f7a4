package e2b

// envd: the in-sandbox daemon's API, served on the same origin as the
// control plane (E2B_SANDBOX_URL) and routed by the E2b-Sandbox-Id header
// (e2b.md §1, §4). Served here: filesystem.Filesystem/{Stat, ListDir,
// MakeDir, Move, Remove} (Connect RPC, generated handlers), GET/POST
// /files and GET /health; watch.go serves WatchDir (by polling);
// process.go serves process.Process/{Start, Connect, List, SendSignal,
// SendInput, StreamInput, CloseStdin, Update} (live stdin and PTYs are
// native terminals).
//
// Authorisation: create and connect answer envdAccessToken, the
// sandbox's own access token (signed.go), which the SDK sends as
// X-Access-Token on every envd request. It opens that sandbox only: the
// call runs as native API calls with the token of the key that created or
// connected the sandbox (the same ownership checks as everything else).
// The project's key is accepted there too. A request without either is
// refused.

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	efs "github.com/warrenhq/warren/api/e2b/filesystem"
	"github.com/warrenhq/warren/api/e2b/filesystem/filesystemconnect"
	eproc "github.com/warrenhq/warren/api/e2b/process"
	"github.com/warrenhq/warren/api/e2b/process/processconnect"
	warren "github.com/warrenhq/warren/sdk/go"
)

const (
	sandboxIDHeader   = "E2b-Sandbox-Id"
	accessTokenHeader = "X-Access-Token"
	maxListDepth      = 8
	maxListEntries    = 100_000
	// maxRPCMessage bounds one Connect message a client sends (the SDKs'
	// requests are small JSON documents).
	maxRPCMessage = 1 << 20
)

// isEnvd reports whether r is envd traffic rather than control plane.
func isEnvd(r *http.Request) bool {
	if isSigned(r) {
		return true // a signed link carries no header (signed.go)
	}
	if r.Header.Get(sandboxIDHeader) == "" {
		return false
	}
	p := r.URL.Path
	return p == "/files" || p == "/health" || strings.HasPrefix(p, "/filesystem.Filesystem/") || strings.HasPrefix(p, "/process.Process/")
}

// envdCaller is the sandbox and native client of one envd request.
type envdCaller struct {
	id    string
	c     *warren.Client
	cs    *warren.Client // the same, with answers streamed (exec)
	tok   string
	s     *Server
	facts *factCache
}

// live is the native client for commands with live input (terminals,
// over a WebSocket upgrade on an in-process connection).
func (ec *envdCaller) live() *warren.Client {
	return warren.New(internalBase, ec.tok, warren.WithHTTPClient(ec.s.liveClient()), warren.WithRetry(1, 0, 0))
}

func (s *Server) envdCaller(h http.Header) (*envdCaller, error) {
	id := h.Get(sandboxIDHeader)
	key, err := s.keys.keyFor(envdTokenPrefix, id, h.Get(accessTokenHeader))
	if err != nil {
		return nil, fmt.Errorf("X-Access-Token: %w", err)
	}
	tok, err := TokenFromKey(key)
	if err != nil {
		return nil, errors.New("missing or malformed X-Access-Token: connect to the sandbox through the control plane first")
	}
	return &envdCaller{id: id, c: warren.New(internalBase, tok, warren.WithHTTPClient(s.hc), warren.WithRetry(1, 0, 0)),
		cs:  warren.New(internalBase, tok, warren.WithHTTPClient(s.streamHC), warren.WithRetry(1, 0, 0)),
		tok: tok, s: s, facts: &s.facts}, nil
}

// newEnvd builds the envd handler.
func (s *Server) newEnvd() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxRPCMessage)}
	p, h := filesystemconnect.NewFilesystemHandler(&fsService{s: s}, opts...)
	mux.Handle(p, knownMethods(h, efs.File_filesystem_filesystem_proto))
	pp, ph := processconnect.NewProcessHandler(&procService{s: s}, opts...)
	mux.Handle(pp, knownMethods(ph, eproc.File_process_process_proto))
	mux.HandleFunc("GET /health", s.envdHealth)
	mux.HandleFunc("GET /files", s.envdRead)
	mux.HandleFunc("POST /files", s.envdWrite)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no envd route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// knownMethods answers a method the service does not have with a Connect
// error (unimplemented, JSON), where connect-go's handler answers a plain
// text 404.
func knownMethods(h http.Handler, fd protoreflect.FileDescriptor) http.Handler {
	known := map[string]bool{}
	svcs := fd.Services()
	for i := 0; i < svcs.Len(); i++ {
		ms := svcs.Get(i).Methods()
		for j := 0; j < ms.Len(); j++ {
			known["/"+string(svcs.Get(i).FullName())+"/"+string(ms.Get(j).Name())] = true
		}
	}
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !known[r.URL.Path] {
			_ = ew.Write(w, r, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("envd has no method %s", r.URL.Path)))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// httpCaller is envdCaller for the plain-HTTP routes, answering the error.
// A signed /files request (op: read or write) is authorised by its
// signature instead (signed.go).
func (s *Server) httpCaller(w http.ResponseWriter, r *http.Request, op string) *envdCaller {
	if op != "" && isSigned(r) {
		return s.signedCaller(w, r, op)
	}
	ec, err := s.envdCaller(r.Header)
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return nil
	}
	return ec
}

// envdStatus maps a native error of an envd HTTP route: an unknown
// sandbox is 502 (what E2B's edge answers; the SDK reads "not running").
func (s *Server) envdHTTPError(w http.ResponseWriter, err error, sandboxGone bool) {
	var ae *warren.APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound && sandboxGone {
		writeError(w, http.StatusBadGateway, "sandbox not found or not running")
		return
	}
	if errors.As(err, &ae) && ae.Status == http.StatusUnprocessableEntity {
		writeError(w, http.StatusBadRequest, ae.Message)
		return
	}
	s.writeErr(w, "envd", err)
}

func (s *Server) envdHealth(w http.ResponseWriter, r *http.Request) {
	ec := s.httpCaller(w, r, "")
	if ec == nil {
		return
	}
	if _, err := live(r.Context(), ec.c, ec.id); err != nil {
		writeError(w, http.StatusBadGateway, "sandbox not found or not running")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// homeOf is where relative paths resolve: the sandbox user's home.
func homeOf(user string) string {
	if user == "" || user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolve makes p absolute against the sandbox's default user's home.
func resolve(ctx context.Context, ec *envdCaller, p string) (string, error) {
	if p == "" {
		// Not the home directory: files.remove("") must not empty it.
		return "", &warren.APIError{Status: http.StatusBadRequest, Code: api.CodeInvalid, Message: "path is required"}
	}
	if strings.HasPrefix(p, "/") {
		return path.Clean(p), nil
	}
	f, err := ec.facts.get(ctx, ec)
	if err != nil {
		return "", err
	}
	return path.Join(homeOf(f.user), p), nil
}

func (s *Server) envdRead(w http.ResponseWriter, r *http.Request) {
	ec := s.httpCaller(w, r, "read")
	if ec == nil {
		return
	}
	ctx := r.Context()
	p, err := resolve(ctx, ec, r.URL.Query().Get("path"))
	if err != nil {
		s.envdHTTPError(w, err, true)
		return
	}
	fi, err := ec.c.Stat(ctx, ec.id, p)
	if err != nil {
		s.envdHTTPError(w, err, false)
		return
	}
	if fi.Type == "dir" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %s is a directory", p))
		return
	}
	rc, err := ec.c.ReadFile(ctx, ec.id, p)
	if err != nil {
		s.envdHTTPError(w, err, false)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		panic(http.ErrAbortHandler) // never a short 200
	}
}

// writeInfo is one element of the /files upload answer.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// envdWrite is envd's file upload (POST /files): a multipart form of
// "file" parts, or one octet-stream body (plain or gzip), each written
// (its directories made) to ?path= or, in a form, to the part's filename.
// It answers what it wrote.
func (s *Server) envdWrite(w http.ResponseWriter, r *http.Request) {
	ec := s.httpCaller(w, r, "write")
	if ec == nil {
		return
	}
	ctx := r.Context()
	qpath := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeInfo
	write := func(dst string, body io.Reader) bool {
		p, err := resolve(ctx, ec, dst)
		if err != nil {
			s.envdHTTPError(w, err, true)
			return false
		}
		if _, err := ec.c.Mkdir(ctx, ec.id, api.MkdirRequest{Path: path.Dir(p), Parents: true}); err != nil {
			s.envdHTTPError(w, err, false)
			return false
		}
		if _, err := ec.c.WriteFile(ctx, ec.id, p, body, 0o644); err != nil {
			s.envdHTTPError(w, err, false)
			return false
		}
		out = append(out, writeInfo{Name: path.Base(p), Type: "file", Path: p})
		return true
	}
	switch ct {
	case "multipart/form-data":
		if !writeParts(w, multipart.NewReader(r.Body, params["boundary"]), qpath, write) {
			return
		}
	case "application/octet-stream":
		if !writeStream(w, r, qpath, write) {
			return
		}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported Content-Type %q: multipart/form-data or application/octet-stream", ct))
		return
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "no file in the upload")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// writeParts writes each "file" part of a multipart upload with write, to
// qpath or else the part's filename. It reports false when it has answered
// the request with an error (or write has).
func writeParts(w http.ResponseWriter, mr *multipart.Reader, qpath string, write func(dst string, body io.Reader) bool) bool {
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("malformed multipart body: %v", err))
			return false
		}
		if part.FormName() != "file" {
			continue
		}
		dst := qpath
		if dst == "" {
			dst = partFileName(part)
		}
		if dst == "" {
			writeError(w, http.StatusBadRequest, "a file part has no filename and the request no path")
			return false
		}
		if !write(dst, part) {
			return false
		}
	}
}

// writeStream writes an octet-stream upload's body (gunzipped when its
// Content-Encoding is gzip) with write to qpath, which it needs. It
// reports false when it has answered the request with an error (or write
// has).
func writeStream(w http.ResponseWriter, r *http.Request, qpath string, write func(dst string, body io.Reader) bool) bool {
	if qpath == "" {
		writeError(w, http.StatusBadRequest, "an octet-stream upload needs ?path=")
		return false
	}
	var body io.Reader = r.Body
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("malformed gzip body: %v", err))
			return false
		}
		defer zr.Close()
		body = zr
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported Content-Encoding %q", enc))
		return false
	}
	return write(qpath, body)
}

// partFileName is the full filename of a part (Part.FileName keeps only
// the base name; E2B sends the destination path there).
func partFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// fsService serves filesystem.Filesystem over the native files API.
type fsService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}

func (f *fsService) caller(h http.Header) (*envdCaller, error) {
	ec, err := f.s.envdCaller(h)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return ec, nil
}

// rpcError maps a native error to a Connect error.
func rpcError(err error) error {
	var ae *warren.APIError
	if !errors.As(err, &ae) {
		return connect.NewError(connect.CodeInternal, err)
	}
	code := connect.CodeInternal
	switch ae.Status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge:
		code = connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		code = connect.CodeUnauthenticated
	case http.StatusForbidden:
		code = connect.CodePermissionDenied
	case http.StatusNotFound:
		code = connect.CodeNotFound
	case http.StatusConflict:
		code = connect.CodeAlreadyExists
	case http.StatusTooManyRequests:
		code = connect.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		code = connect.CodeUnavailable
	case http.StatusGatewayTimeout:
		code = connect.CodeDeadlineExceeded
	}
	return connect.NewError(code, errors.New(ae.Message))
}

func entryOf(fi *api.FileInfo) *efs.EntryInfo {
	mode := fs.FileMode(fi.Mode & 0o7777)
	e := &efs.EntryInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, ModifiedTime: timestamppb.New(fi.ModTime)}
	switch fi.Type {
	case "file":
		e.Type = efs.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type, mode = efs.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case "symlink":
		e.Type, e.IsSymlink, mode = efs.FileType_FILE_TYPE_SYMLINK, true, mode|fs.ModeSymlink
		t := fi.Target
		e.SymlinkTarget = &t
	}
	e.Mode, e.Permissions = uint32(mode), mode.String()
	return e
}

// callerAt authenticates a filesystem call and resolves its path in the
// sandbox (a relative path against the default user's home).
func (f *fsService) callerAt(ctx context.Context, h http.Header, p string) (*envdCaller, string, error) {
	ec, err := f.caller(h)
	if err != nil {
		return nil, "", err
	}
	abs, err := resolve(ctx, ec, p)
	if err != nil {
		return nil, "", rpcError(err)
	}
	return ec, abs, nil
}

func (f *fsService) stat(ctx context.Context, ec *envdCaller, p string) (*efs.EntryInfo, string, error) {
	abs, err := resolve(ctx, ec, p)
	if err != nil {
		return nil, "", rpcError(err)
	}
	fi, err := ec.c.Stat(ctx, ec.id, abs)
	if err != nil {
		return nil, abs, rpcError(err)
	}
	return entryOf(fi), abs, nil
}

func (f *fsService) Stat(ctx context.Context, req *connect.Request[efs.StatRequest]) (*connect.Response[efs.StatResponse], error) {
	ec, err := f.caller(req.Header())
	if err != nil {
		return nil, err
	}
	e, _, err := f.stat(ctx, ec, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&efs.StatResponse{Entry: e}), nil
}

func (f *fsService) ListDir(ctx context.Context, req *connect.Request[efs.ListDirRequest]) (*connect.Response[efs.ListDirResponse], error) {
	ec, err := f.caller(req.Header())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth %d exceeds %d", depth, maxListDepth))
	}
	root, err := resolve(ctx, ec, req.Msg.GetPath())
	if err != nil {
		return nil, rpcError(err)
	}
	files, err := walkFiles(ctx, ec, root, depth, maxListEntries)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, rpcError(err)
	}
	out := make([]*efs.EntryInfo, 0, len(files))
	for i := range files {
		out = append(out, entryOf(&files[i]))
	}
	return connect.NewResponse(&efs.ListDirResponse{Entries: out}), nil
}

func (f *fsService) MakeDir(ctx context.Context, req *connect.Request[efs.MakeDirRequest]) (*connect.Response[efs.MakeDirResponse], error) {
	ec, abs, err := f.callerAt(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := ec.c.Stat(ctx, ec.id, abs); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", abs))
	} else if !warren.IsNotFound(err) {
		return nil, rpcError(err)
	}
	fi, err := ec.c.Mkdir(ctx, ec.id, api.MkdirRequest{Path: abs, Parents: true})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&efs.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (f *fsService) Move(ctx context.Context, req *connect.Request[efs.MoveRequest]) (*connect.Response[efs.MoveResponse], error) {
	ec, src, err := f.callerAt(ctx, req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := resolve(ctx, ec, req.Msg.GetDestination())
	if err != nil {
		return nil, rpcError(err)
	}
	if err := ec.c.Rename(ctx, ec.id, src, dst); err != nil {
		return nil, rpcError(err)
	}
	e, _, err := f.stat(ctx, ec, dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&efs.MoveResponse{Entry: e}), nil
}

func (f *fsService) Remove(ctx context.Context, req *connect.Request[efs.RemoveRequest]) (*connect.Response[efs.RemoveResponse], error) {
	ec, abs, err := f.callerAt(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := ec.c.Remove(ctx, ec.id, abs, true); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&efs.RemoveResponse{}), nil
}
