package api

// Terminals: GET /v1/sandboxes/{id}/pty upgrades to a WebSocket. Binary
// messages carry the terminal's bytes both ways; text messages carry
// TermMessage JSON: from the client "resize" (Cols, Rows), "signal"
// (Signal, sent to the command's process group) and "eof" (the end of its
// input); from the server "exit" (Code and the rest of the command's
// result) once the command ended, or "error" (Error) when it could not run
// or its stream broke. The server then closes the WebSocket (status 1000
// after "exit", 1011 after "error").

// Terminal sizes: 1..MaxTermSize columns and rows; DefaultTermCols x
// DefaultTermRows when not given.
const (
	MaxTermSize     = 4096
	DefaultTermCols = 80
	DefaultTermRows = 24
)

// Types of TermMessage.
const (
	TermResize = "resize"
	TermSignal = "signal"
	TermEOF    = "eof"
	TermExit   = "exit"
	TermError  = "error"
)

// TermSize is a terminal's size in characters.
type TermSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// Valid says whether s is a terminal size warren takes.
func (s TermSize) Valid() bool {
	return s.Cols >= 1 && s.Rows >= 1 && s.Cols <= MaxTermSize && s.Rows <= MaxTermSize
}

// TermMessage is a terminal WebSocket's control message (a text frame).
type TermMessage struct {
	Type   string `json:"type"`
	Cols   int    `json:"cols,omitempty"`
	Rows   int    `json:"rows,omitempty"`
	Signal int    `json:"signal,omitempty"`
	// Code is the exit code (type "exit"); Result the whole result.
	Code   *int        `json:"code,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}
