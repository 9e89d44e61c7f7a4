// Command portsrv is a small static server that e2e tests copy into a
// sandbox to reach its ports through the API (ports_test.go):
//
//	portsrv http PORT   HTTP: /info (what the request looked like), /big?n=N
//	                    (N bytes, chunked, flushed as written), /sum (the
//	                    SHA-256 and length of the body, read as it comes),
//	                    /ws (a WebSocket echo)
//	portsrv echo PORT   raw TCP: echoes every byte, then closes its side
//	                    once the peer closed its own
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"

	"golang.org/x/net/websocket"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: portsrv http|echo PORT")
		os.Exit(2)
	}
	addr := ":" + os.Args[2]
	switch os.Args[1] {
	case "http":
		err := http.ListenAndServe(addr, mux())
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case "echo":
		echo(addr)
	}
}

func mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("/info", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{
			"method": r.Method, "uri": r.RequestURI, "path": r.URL.Path,
			"authorization": r.Header.Get("Authorization"), "prefix": r.Header.Get("X-Forwarded-Prefix"),
			"host": r.Host, "x": r.Header.Get("X-Test"),
		})
	})
	m.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		buf := make([]byte, 64<<10)
		for i := range buf {
			buf[i] = byte('a' + i%26)
		}
		fl := http.NewResponseController(w)
		for n > 0 {
			k := min(n, int64(len(buf)))
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			_ = fl.Flush()
			n -= k
		}
	})
	m.HandleFunc("/sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	})
	m.Handle("/ws", websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) }))
	return m
}

func echo(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
	}
}
