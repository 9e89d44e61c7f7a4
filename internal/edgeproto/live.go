package edgeproto

import (
	"slices"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// OpExecLive runs a foreground command with live input (data plane only):
// an ExecLiveRequest, then the command's input as the call's upload, in
// dataplane input frames (dataplane.InputData, InputResize, InputSignal,
// InputEOF); the answer streams its output (stdout and stderr chunks; a
// terminal's all as stdout) and ends with an api.ExecResult. The command
// is killed, its whole session for a terminal, when the caller goes away.
// Terminals and E2B processes with stdin are built on it.
const OpExecLive = "exec_live"

// ExecLiveRequest is OpExecLive's request. With PTY the command runs on a
// terminal of that size (neither Cmd nor Argv: the sandbox's shell);
// without, its stdin stays open for the input. Exec.Stdin is written
// first. Timeout and OutputCap are as exec's, except that 0 means none
// (the sandbox's TTL and idle timeout bound a terminal) and the cap most.
type ExecLiveRequest struct {
	ID   string          `json:"id"`
	Exec api.ExecRequest `json:"exec"`
	PTY  *api.TermSize   `json:"pty,omitempty"`
}

// MaxLiveOutputCap bounds a live command's output_cap (the edge's
// MaxOutputCap).
const MaxLiveOutputCap = 1 << 30

// CheckLive validates an OpExecLive request (the apiserver checks it before
// it upgrades a terminal's connection).
func CheckLive(req *ExecLiveRequest) error {
	x := &req.Exec
	if x.Background || x.Trusted || x.KeepCPU || x.Session != "" {
		return &api.Error{Code: api.CodeInvalid, Message: "background, trusted, keep_cpu and session are not for commands with live input"}
	}
	if x.Cmd != "" && len(x.Argv) > 0 || req.PTY == nil && x.Cmd == "" && len(x.Argv) == 0 {
		return &api.Error{Code: api.CodeInvalid, Message: "exactly one of cmd and argv is required (a terminal may have neither: the sandbox's shell)"}
	}
	if strings.IndexByte(x.Cmd, 0) >= 0 || slices.ContainsFunc(x.Argv, func(a string) bool { return strings.IndexByte(a, 0) >= 0 }) {
		return &api.Error{Code: api.CodeInvalid, Message: "cmd and argv must not contain a NUL byte"}
	}
	if req.PTY != nil && !req.PTY.Valid() {
		return &api.Error{Code: api.CodeInvalid, Message: "a terminal's cols and rows must be between 1 and 4096"}
	}
	if aerr := sandboxspec.CheckEnv(x.Env); aerr != nil {
		return aerr
	}
	if aerr := sandboxspec.CheckUser(x.User); aerr != nil {
		return aerr
	}
	if x.Timeout < 0 || x.OutputCap < 0 || x.OutputCap > MaxLiveOutputCap {
		return &api.Error{Code: api.CodeInvalid, Message: "timeout and output_cap must be positive (output_cap at most 1 GiB)"}
	}
	return nil
}
