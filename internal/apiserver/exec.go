package apiserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
)

const ndjson = "application/x-ndjson"

func wantsStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), ndjson)
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.ExecRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if (req.Cmd == "") == (len(req.Argv) == 0) {
		return &api.Error{Code: api.CodeInvalid, Message: "exactly one of cmd and argv is required"}
	}
	if req.Timeout < 0 || req.OutputCap < 0 {
		return &api.Error{Code: api.CodeInvalid, Message: "timeout and output_cap must not be negative"}
	}
	if res, ok, err := s.fastForwardExec(r.Context(), id, &req); err != nil {
		return err
	} else if ok {
		return s.answerReplayed(w, r, res)
	}
	ereq := &edgeproto.ExecRequest{ID: id, Exec: req}
	if wantsStream(r) && !req.Background {
		return s.execStream(w, r, ereq)
	}
	var stdout, stderr bytes.Buffer
	var res api.ExecResult
	err := s.callEdge(r.Context(), id, edgeproto.OpExec, ereq, &res, func(c bus.Chunk) error {
		if c.Stream == "stderr" {
			stderr.Write(c.Data)
		} else {
			stdout.Write(c.Data)
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	status := http.StatusOK
	if req.Background {
		status = http.StatusAccepted
	}
	writeJSON(w, status, &res)
	return nil
}

// answerReplayed answers an exec from a delegated fast-forward, as JSON or
// as an NDJSON stream.
func (s *Server) answerReplayed(w http.ResponseWriter, r *http.Request, res *api.ExecResult) error {
	if !wantsStream(r) {
		writeJSON(w, http.StatusOK, res)
		return nil
	}
	w.Header().Set("Content-Type", ndjson)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if res.Stdout != "" {
		_ = enc.Encode(&api.ExecEvent{Stdout: &res.Stdout})
	}
	if res.Stderr != "" {
		_ = enc.Encode(&api.ExecEvent{Stderr: &res.Stderr})
	}
	code, dur := res.ExitCode, res.DurationMs
	return enc.Encode(&api.ExecEvent{ExitCode: &code, Truncated: res.Truncated, TimedOut: res.TimedOut, Signal: res.Signal,
		OOMKilled: res.OOMKilled, KilledBy: res.KilledBy, PidsLimited: res.PidsLimited, DiskFull: res.DiskFull,
		DurationMs: &dur, Step: res.Step, Replayed: true})
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request, ereq *edgeproto.ExecRequest) error {
	flusher, _ := w.(http.Flusher)
	started := false
	enc := json.NewEncoder(w)
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", ndjson)
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusOK)
		}
	}
	var res api.ExecResult
	// A UTF-8 character may be split across chunks: hold its first bytes
	// back until the rest arrives, per stream.
	var carry [2][]byte
	err := s.callEdge(r.Context(), ereq.ID, edgeproto.OpExec, ereq, &res, func(c bus.Chunk) error {
		start()
		i := 0
		if c.Stream == "stderr" {
			i = 1
		}
		buf := append(carry[i], c.Data...)
		cut := completeUTF8(buf)
		carry[i] = append([]byte(nil), buf[cut:]...)
		if cut == 0 {
			return nil
		}
		data := string(buf[:cut])
		ev := api.ExecEvent{}
		if i == 1 {
			ev.Stderr = &data
		} else {
			ev.Stdout = &data
		}
		if err := enc.Encode(&ev); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	if err != nil {
		if !started {
			return err
		}
		ae := s.toAPIError(err)
		_ = enc.Encode(&api.ExecEvent{Error: ae})
		return nil
	}
	start()
	for i, rest := range carry {
		if len(rest) > 0 {
			data := string(rest)
			ev := api.ExecEvent{Stdout: &data}
			if i == 1 {
				ev = api.ExecEvent{Stderr: &data}
			}
			_ = enc.Encode(&ev)
		}
	}
	code, dur := res.ExitCode, res.DurationMs
	_ = enc.Encode(&api.ExecEvent{ExitCode: &code, Truncated: res.Truncated, TimedOut: res.TimedOut, Signal: res.Signal, DurationMs: &dur,
		OOMKilled: res.OOMKilled, KilledBy: res.KilledBy, PidsLimited: res.PidsLimited, DiskFull: res.DiskFull,
		Step: res.Step, Replayed: res.Replayed, Sandbox: res.Sandbox, Trajectory: res.Trajectory})
	if flusher != nil {
		flusher.Flush()
	}
	return nil
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	req := &edgeproto.CommandRequest{ID: id, CommandID: r.PathValue("cid")}
	req.Wait, _ = strconv.ParseBool(r.URL.Query().Get("wait"))
	var c api.Command
	if err := s.callEdge(r.Context(), id, edgeproto.OpCommandGet, req, &c, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &c)
	return nil
}

func (s *Server) killCommand(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var body struct {
		Signal int `json:"signal"`
	}
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, &body); err != nil {
			return err
		}
	}
	req := &edgeproto.CommandRequest{ID: id, CommandID: r.PathValue("cid"), Signal: body.Signal}
	var c api.Command
	if err := s.callEdge(r.Context(), id, edgeproto.OpCommandKill, req, &c, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &c)
	return nil
}

// completeUTF8 returns the length of the longest prefix of b that does not
// end inside a (possibly still arriving) multi-byte UTF-8 character.
func completeUTF8(b []byte) int {
	n := len(b)
	for i := 1; i <= 3 && i <= n; i++ {
		c := b[n-i]
		if c < 0x80 {
			return n // ASCII: nothing pending
		}
		if c >= 0xF5 || c == 0xC0 || c == 0xC1 {
			return n // never valid: nothing to wait for
		}
		if c >= 0xC0 { // a leading byte: is its sequence complete?
			need := 2
			switch {
			case c >= 0xF0:
				need = 4
			case c >= 0xE0:
				need = 3
			}
			if i < need {
				return n - i
			}
			return n
		}
	}
	return n
}
