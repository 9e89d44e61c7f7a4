package apiserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// MaxPathLength bounds a sandbox path.
const MaxPathLength = 4096

// CheckPath validates a path inside a sandbox: absolute, bounded, no NUL.
// The agent resolves it inside the sandbox root, so ".." cannot lead out;
// it is still cleaned here so logs and errors show the real target.
func CheckPath(p string) (string, error) {
	if p == "" {
		return "", &api.Error{Code: api.CodeBadRequest, Message: "path is required"}
	}
	if len(p) > MaxPathLength || strings.IndexByte(p, 0) >= 0 || !strings.HasPrefix(p, "/") {
		return "", &api.Error{Code: api.CodeBadRequest, Message: "path must be absolute, without NUL bytes, at most 4096 bytes"}
	}
	return path.Clean(p), nil
}

func queryBool(r *http.Request, name string) bool {
	b, _ := strconv.ParseBool(r.URL.Query().Get(name))
	return b
}

// putFile writes the request's body to ?path= in a sandbox (?mode= its
// octal permissions): a small file in one atomic write, a large one over
// the data plane when the edge streams uploads, or else in chunks over the
// bus.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	p, mode, err := putTarget(r)
	if err != nil {
		return err
	}
	if r.ContentLength > MaxFileBody {
		return &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("file exceeds %d bytes", MaxFileBody)}
	}
	body := http.MaxBytesReader(w, r.Body, MaxFileBody)
	buf := make([]byte, singleWrite)
	// dataplane.ReadChunk, not io.ReadFull: a body cut short (its client
	// went away) must fail, not be written as a shorter file.
	n, err := dataplane.ReadChunk(body, buf)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	var info api.FileInfo
	if n < singleWrite {
		// Small files: one atomic write.
		if fi, ok, err := s.fastForwardFile(r.Context(), id, &api.TrajectoryStep{Op: "write", Path: p, Mode: mode,
			DataHash: digest(buf[:n]), DataSize: int64(n)}); err != nil {
			return err
		} else if ok {
			writeJSON(w, http.StatusOK, fi)
			return nil
		}
		err := s.callEdge(r.Context(), id, edgeproto.OpFileWrite, &edgeproto.FileRequest{ID: id, Path: p, Mode: mode, Data: buf[:n]}, &info, nil)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, &info)
		return nil
	}
	if s.canStream(id, edgeproto.OpFileUpload) {
		// Large files over the data plane: the edge appends them to a
		// temporary name and renames it into place, with flow control
		// from the client's socket to the agent's writes; a client that
		// goes away breaks the stream and leaves nothing.
		in := io.MultiReader(bytes.NewReader(buf[:n]), body)
		if err := s.callEdge(withUpload(r.Context(), in), id, edgeproto.OpFileUpload, &edgeproto.FileRequest{ID: id, Path: p, Mode: mode}, &info, nil); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, &info)
		return nil
	}
	if err := s.uploadOverBus(r.Context(), id, p, mode, buf, n, body); err != nil {
		return err
	}
	if err := s.callEdge(r.Context(), id, edgeproto.OpFileStat, &edgeproto.FileRequest{ID: id, Path: p}, &info, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &info)
	return nil
}

// putTarget is a file upload's checked ?path= (not /) and ?mode= (octal
// permissions; 0 when absent).
func putTarget(r *http.Request) (string, uint32, error) {
	p, err := CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		return "", 0, err
	}
	if p == "/" {
		return "", 0, &api.Error{Code: api.CodeBadRequest, Message: "cannot write to /"}
	}
	var mode uint32
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			return "", 0, &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("mode %q is not an octal permission", truncate(m))}
		}
		mode = uint32(v)
	}
	return p, mode, nil
}

// uploadOverBus writes a large file to p over the bus: the first n bytes
// already read into buf, then the rest of body, appended chunk by chunk to
// a temporary name beside p, which is then renamed to p. On an error the
// temporary file is removed (also, above all, when the client went away).
func (s *Server) uploadOverBus(ctx context.Context, id, p string, mode uint32, buf []byte, n int, body io.Reader) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(path.Dir(p), ".warren-upload-"+hex.EncodeToString(rnd[:]))
	fail := func(err error) error {
		// Also (above all) when the client went away: its ctx is done.
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		_ = s.callEdge(cctx, id, edgeproto.OpFileRemove, &edgeproto.FileRequest{ID: id, Path: tmp}, nil, nil)
		return err
	}
	chunk := buf[:n]
	appendMode := false
	for {
		for len(chunk) > 0 {
			c := chunk
			if len(c) > uploadChunk {
				c = c[:uploadChunk]
			}
			if err := s.callEdge(ctx, id, edgeproto.OpFileWrite, &edgeproto.FileRequest{ID: id, Path: tmp, Mode: mode, Data: c, Append: appendMode}, nil, nil); err != nil {
				return fail(err)
			}
			appendMode = true
			chunk = chunk[len(c):]
		}
		n, err := dataplane.ReadChunk(body, buf)
		chunk = buf[:n]
		if err != nil {
			if errors.Is(err, io.EOF) {
				if n == 0 {
					break
				}
				continue
			}
			return fail(err)
		}
	}
	if err := s.callEdge(ctx, id, edgeproto.OpFileRename, &edgeproto.FileRequest{ID: id, Path: tmp, To: p}, nil, nil); err != nil {
		return fail(err)
	}
	return nil
}

// streamDownload answers with the chunks of a read as raw bytes. The status
// is sent with the first chunk, so an error before any data keeps its code.
func (s *Server) streamDownload(w http.ResponseWriter, r *http.Request, id, op, contentType string, req *edgeproto.FileRequest) error {
	started := false
	flusher, _ := w.(http.Flusher)
	err := s.callEdge(r.Context(), id, op, req, nil, func(c bus.Chunk) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", contentType)
			w.WriteHeader(http.StatusOK)
		}
		_, err := w.Write(c.Data)
		return err
	})
	if err != nil {
		return err
	}
	if !started {
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
	}
	if flusher != nil {
		flusher.Flush()
	}
	return nil
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	p, err := CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	req := &edgeproto.FileRequest{ID: id, Path: p}
	switch {
	case queryBool(r, "list"):
		var l api.FileList
		if err := s.callEdge(r.Context(), id, edgeproto.OpFileList, req, &l, nil); err != nil {
			return err
		}
		if l.Files == nil {
			l.Files = []api.FileInfo{}
		}
		writeJSON(w, http.StatusOK, &l)
		return nil
	case queryBool(r, "stat"):
		var fi api.FileInfo
		if err := s.callEdge(r.Context(), id, edgeproto.OpFileStat, req, &fi, nil); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, &fi)
		return nil
	}
	return s.streamDownload(w, r, id, edgeproto.OpFileRead, "application/octet-stream", req)
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	p, err := CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	if p == "/" {
		return &api.Error{Code: api.CodeBadRequest, Message: "cannot remove /"}
	}
	recursive := queryBool(r, "recursive")
	if fi, ok, err := s.fastForwardFile(r.Context(), id, &api.TrajectoryStep{Op: "remove", Path: p, Recursive: recursive}); err != nil {
		return err
	} else if ok {
		stepHeaders(w, &edgeproto.StepResult{Step: fi.Step, Replayed: true})
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	var sr edgeproto.StepResult
	if err := s.callEdge(r.Context(), id, edgeproto.OpFileRemove, &edgeproto.FileRequest{ID: id, Path: p, Recursive: recursive}, &sr, nil); err != nil {
		return err
	}
	stepHeaders(w, &sr)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.MkdirRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := CheckPath(req.Path)
	if err != nil {
		return err
	}
	if req.Mode > 0o7777 {
		return &api.Error{Code: api.CodeInvalid, Message: "mode must be a permission (at most 07777)"}
	}
	if fi, ok, err := s.fastForwardFile(r.Context(), id, &api.TrajectoryStep{Op: "mkdir", Path: p, Mode: req.Mode, Parents: req.Parents}); err != nil {
		return err
	} else if ok {
		writeJSON(w, http.StatusOK, fi)
		return nil
	}
	var fi api.FileInfo
	if err := s.callEdge(r.Context(), id, edgeproto.OpFileMkdir, &edgeproto.FileRequest{ID: id, Path: p, Mode: req.Mode, Parents: req.Parents}, &fi, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &fi)
	return nil
}

func (s *Server) rename(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.RenameRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	from, err := CheckPath(req.From)
	if err != nil {
		return err
	}
	to, err := CheckPath(req.To)
	if err != nil {
		return err
	}
	if fi, ok, err := s.fastForwardFile(r.Context(), id, &api.TrajectoryStep{Op: "rename", Path: from, To: to}); err != nil {
		return err
	} else if ok {
		stepHeaders(w, &edgeproto.StepResult{Step: fi.Step, Replayed: true})
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	var sr edgeproto.StepResult
	if err := s.callEdge(r.Context(), id, edgeproto.OpFileRename, &edgeproto.FileRequest{ID: id, Path: from, To: to}, &sr, nil); err != nil {
		return err
	}
	stepHeaders(w, &sr)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) putArchive(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	p, err := CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, MaxArchive)
	if s.canStream(id, edgeproto.OpTarUpload) {
		// Over the data plane: one stream, with flow control; a client
		// that goes away breaks it and ends the extraction.
		var res edgeproto.TarPutResult
		if err := s.callEdge(withUpload(r.Context(), body), id, edgeproto.OpTarUpload, &edgeproto.FileRequest{ID: id, Path: p}, &res, nil); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, map[string]int{"files": res.Files})
		return nil
	}
	buf := make([]byte, uploadChunk)
	var res edgeproto.TarPutResult
	handle := ""
	for {
		n, rerr := dataplane.ReadChunk(body, buf)
		final := rerr != nil
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			if handle != "" { // end the agent's extraction, also when the client went away
				cctx, cancel := cleanupContext(r.Context())
				_ = s.callEdge(cctx, id, edgeproto.OpTarPut, &edgeproto.FileRequest{ID: id, Path: p, Handle: handle, Abort: true}, nil, nil)
				cancel()
			}
			return rerr
		}
		req := &edgeproto.FileRequest{ID: id, Path: p, Handle: handle, Data: buf[:n], Final: final}
		if err := s.callEdge(r.Context(), id, edgeproto.OpTarPut, req, &res, nil); err != nil {
			return err
		}
		handle = res.Handle
		if final {
			break
		}
	}
	writeJSON(w, http.StatusOK, map[string]int{"files": res.Files})
	return nil
}

func (s *Server) getArchive(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	p, err := CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	return s.streamDownload(w, r, id, edgeproto.OpTarGet, "application/x-tar", &edgeproto.FileRequest{ID: id, Path: p})
}

// stepHeaders reports a recorded operation's trajectory step on answers
// without a body (Warren-Step, Warren-Replayed; Warren-Sandbox and
// Warren-Trajectory when it branched).
func stepHeaders(w http.ResponseWriter, sr *edgeproto.StepResult) {
	if sr.Step > 0 {
		w.Header().Set("Warren-Step", strconv.FormatInt(sr.Step, 10))
		w.Header().Set("Warren-Replayed", strconv.FormatBool(sr.Replayed))
	}
	if sr.Sandbox != "" {
		w.Header().Set("Warren-Sandbox", sr.Sandbox)
		w.Header().Set("Warren-Trajectory", sr.Trajectory)
	}
}

// cleanupContext is for undoing a request's partial work after the request
// failed, perhaps because its client went away (ctx done): ctx's values
// (the principal), not its end, bounded by its own timeout.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}
