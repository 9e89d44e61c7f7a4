package warren

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/warrenhq/warren/api"
)

// fakeTerminal is a server side of the terminal protocol: it echoes input
// upper-cased, answers a resize with its size, and ends with exit code 3
// at "eof".
func fakeTerminal(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("cmd") == "bad" {
		writeErr(w, 422, api.CodeInvalid, "cols must be a whole number between 1 and 4096")
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			_ = c.Write(ctx, websocket.MessageBinary, []byte(strings.ToUpper(string(b))))
			continue
		}
		var m api.TermMessage
		_ = json.Unmarshal(b, &m)
		switch m.Type {
		case api.TermResize:
			_ = c.Write(ctx, websocket.MessageBinary, []byte("size "+strings.Repeat("x", m.Cols)))
		case api.TermEOF:
			code := 3
			out, _ := json.Marshal(&api.TermMessage{Type: api.TermExit, Code: &code, Result: &api.ExecResult{ExitCode: 3}})
			_ = c.Write(ctx, websocket.MessageText, out)
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

func TestTerminalProtocol(t *testing.T) {
	check := func(t *testing.T, c *Client) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// An answer before the upgrade is the API's error.
		if _, err := c.Terminal(ctx, "sb-n-x", TerminalOptions{Cmd: "bad"}); StatusOf(err) != 422 || CodeOf(err) != api.CodeInvalid {
			t.Fatalf("a refused terminal: %v", err)
		}
		term, err := c.Terminal(ctx, "sb-n-x", TerminalOptions{Cmd: "vi", Cols: 80, Rows: 24})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := term.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := io.ReadAtLeast(term, buf, 5)
		if err != nil || string(buf[:n]) != "HELLO" {
			t.Fatalf("echo: %q %v", buf[:n], err)
		}
		if err := term.Resize(ctx, 3, 2); err != nil {
			t.Fatal(err)
		}
		n, err = io.ReadAtLeast(term, buf, 8)
		if err != nil || string(buf[:n]) != "size xxx" {
			t.Fatalf("resize: %q %v", buf[:n], err)
		}
		if err := term.CloseInput(ctx); err != nil {
			t.Fatal(err)
		}
		if rest, err := io.ReadAll(term); err != nil || len(rest) != 0 {
			t.Fatalf("the rest: %q %v", rest, err)
		}
		res, err := term.Wait(ctx)
		if err != nil || res.ExitCode != 3 {
			t.Fatalf("wait: %+v %v", res, err)
		}
	}
	t.Run("tcp", func(t *testing.T) {
		c, _ := newServer(t, fakeTerminal)
		check(t, c)
	})
	t.Run("in-process", func(t *testing.T) {
		hc, stop := InProcess(http.HandlerFunc(fakeTerminal))
		defer stop()
		check(t, New("http://warren.internal", testToken, WithHTTPClient(hc)))
	})
}
