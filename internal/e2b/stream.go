package e2b

import (
	"fmt"
	"io"
	"net/http"
	"sync"
)

// streamTransport serves requests with an in-process http.Handler whose
// answer is streamed: the response is returned as soon as the handler has
// written its head, and its body is read while the handler still writes
// (an NDJSON exec stream). Closing the body makes the handler's further
// writes fail; cancelling the request's context cancels the handler.
type streamTransport struct{ h http.Handler }

func (t streamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil {
		req.Body = http.NoBody
	}
	req.RemoteAddr = "127.0.0.1:0"
	req.RequestURI = req.URL.RequestURI()
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil { // an aborted answer (http.ErrAbortHandler)
				w.head(http.StatusInternalServerError)
				pw.CloseWithError(fmt.Errorf("e2b: native API aborted the answer: %v", p))
				return
			}
			w.head(http.StatusOK)
			pw.Close()
		}()
		t.h.ServeHTTP(w, req)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req,
	}, nil
}

// pipeWriter is the http.ResponseWriter of streamTransport.
type pipeWriter struct {
	header http.Header
	sent   http.Header // the head as written
	status int
	once   sync.Once
	ready  chan struct{}
	pw     *io.PipeWriter
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) head(status int) {
	w.once.Do(func() {
		w.status, w.sent = status, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) WriteHeader(status int) { w.head(status) }

func (w *pipeWriter) Write(p []byte) (int, error) {
	w.head(http.StatusOK)
	return w.pw.Write(p)
}

// Flush implements http.Flusher: every Write is already handed over.
func (w *pipeWriter) Flush() {}
