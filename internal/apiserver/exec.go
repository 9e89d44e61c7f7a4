package apiserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
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
	ereq := &edge.ExecRequest{ID: id, Exec: req}
	if wantsStream(r) && !req.Background {
		return s.execStream(w, r, ereq)
	}
	var stdout, stderr bytes.Buffer
	var res api.ExecResult
	err := s.callEdge(r.Context(), id, edge.OpExec, ereq, &res, func(c bus.Chunk) error {
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

func (s *Server) execStream(w http.ResponseWriter, r *http.Request, ereq *edge.ExecRequest) error {
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
	err := s.callEdge(r.Context(), ereq.ID, edge.OpExec, ereq, &res, func(c bus.Chunk) error {
		start()
		data := string(c.Data)
		ev := api.ExecEvent{}
		if c.Stream == "stderr" {
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
	code, dur := res.ExitCode, res.DurationMs
	_ = enc.Encode(&api.ExecEvent{ExitCode: &code, Truncated: res.Truncated, TimedOut: res.TimedOut, Signal: res.Signal, DurationMs: &dur})
	if flusher != nil {
		flusher.Flush()
	}
	return nil
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	req := &edge.CommandRequest{ID: id, CommandID: r.PathValue("cid")}
	req.Wait, _ = strconv.ParseBool(r.URL.Query().Get("wait"))
	var c api.Command
	if err := s.callEdge(r.Context(), id, edge.OpCommandGet, req, &c, nil); err != nil {
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
	req := &edge.CommandRequest{ID: id, CommandID: r.PathValue("cid"), Signal: body.Signal}
	var c api.Command
	if err := s.callEdge(r.Context(), id, edge.OpCommandKill, req, &c, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &c)
	return nil
}
