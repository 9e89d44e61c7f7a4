package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
)

// Binary frames carry bulk bytes without JSON (no base64, no scanning).
// Their length word has binaryFlag set (MaxFrame leaves that bit free):
//
//   - a binary chunk (agent → edge), sent only for a request with Binary:
//     8-byte call id, 1 stream byte ('o', 'e', 'd'), then the data;
//   - a binary request (edge → agent), sent only to an agent whose
//     protocol is at least ProtoPayload: 4-byte length of the JSON
//     Request, the Request, then its Payload.
const binaryFlag = 1 << 31

// Proto is the protocol version this agent speaks, in its answers to
// OpSetup (SetupResult) and OpPing (PingResult). 0 (absent): an agent that
// knows no binary frames, credits or cancels.
const (
	Proto        = 3
	ProtoPayload = 2 // binary requests (Request.Payload) are understood
	ProtoOffset  = 3 // a file.write may name its offset (WriteRequest.At)
)

// PingResult answers OpPing.
type PingResult struct {
	Proto int `json:"proto,omitempty"`
}

func streamByte(s string) byte {
	switch s {
	case StreamStdout:
		return 'o'
	case StreamStderr:
		return 'e'
	}
	return 'd'
}

func byteStream(b byte) string {
	switch b {
	case 'o':
		return StreamStdout
	case 'e':
		return StreamStderr
	}
	return StreamData
}

// WriteChunk writes one chunk of call id as a binary frame. Callers
// serialise writers.
func WriteChunk(w io.Writer, id uint64, stream string, data []byte) error {
	if 9+len(data) > MaxFrame {
		return fmt.Errorf("agentproto: chunk of %d bytes exceeds a frame", len(data))
	}
	var hdr [13]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(9+len(data))|binaryFlag)
	binary.BigEndian.PutUint64(hdr[4:], id)
	hdr[12] = streamByte(stream)
	if len(data) < 4<<10 {
		_, err := w.Write(append(hdr[:], data...))
		return err
	}
	bufs := net.Buffers{hdr[:], data} // one writev, no copy
	_, err := bufs.WriteTo(w)
	return err
}

// WriteRequestFrame writes req: a binary frame when it has a Payload, else JSON.
func WriteRequestFrame(w io.Writer, req *Request) error {
	if req.Payload == nil {
		return WriteFrame(w, req)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("agentproto: encode: %w", err)
	}
	n := 4 + len(b) + len(req.Payload)
	if n > MaxFrame {
		return fmt.Errorf("agentproto: frame of %d bytes exceeds %d", n, MaxFrame)
	}
	hdr := make([]byte, 8+len(b))
	binary.BigEndian.PutUint32(hdr, uint32(n)|binaryFlag)
	binary.BigEndian.PutUint32(hdr[4:], uint32(len(b)))
	copy(hdr[8:], b)
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	_, err = w.Write(req.Payload)
	return err
}

// readHeader reads a frame's length word: its size, and whether it is binary.
func readHeader(r io.Reader) (int, bool, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, false, err
	}
	v := binary.BigEndian.Uint32(hdr[:])
	n := int(v &^ binaryFlag)
	if n > MaxFrame {
		return 0, false, fmt.Errorf("agentproto: frame of %d bytes exceeds %d", n, MaxFrame)
	}
	return n, v&binaryFlag != 0, nil
}

func readBody(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("agentproto: short frame: %w", err)
	}
	return b, nil
}

// ReadResponse reads one answer frame, JSON or a binary chunk.
func ReadResponse(r io.Reader, resp *Response) error {
	n, bin, err := readHeader(r)
	if err != nil {
		return err
	}
	b, err := readBody(r, n)
	if err != nil {
		return err
	}
	return decodeResponse(b, bin, resp)
}

// decodeResponse decodes a frame's body b: JSON, or a binary chunk.
func decodeResponse(b []byte, bin bool, resp *Response) error {
	if !bin {
		if err := json.Unmarshal(b, resp); err != nil {
			return fmt.Errorf("agentproto: decode: %w", err)
		}
		return nil
	}
	if len(b) < 9 {
		return fmt.Errorf("agentproto: binary chunk of %d bytes", len(b))
	}
	*resp = Response{ID: binary.BigEndian.Uint64(b), Kind: KindChunk, Stream: byteStream(b[8]), Data: b[9:]}
	return nil
}

// ReadRequest reads one request frame, JSON or binary (with a Payload).
func ReadRequest(r io.Reader, req *Request) error {
	n, bin, err := readHeader(r)
	if err != nil {
		return err
	}
	b, err := readBody(r, n)
	if err != nil {
		return err
	}
	return decodeRequest(b, bin, req)
}

// requestBufs holds the frames of binary requests of up to
// PooledRequestFrame bytes (an upload's 4 MiB write and its JSON) that the
// agent reads with ReadRequestPooled.
var requestBufs = sync.Pool{New: func() any { b := make([]byte, PooledRequestFrame); return &b }}

// PooledRequestFrame is the largest binary request frame that
// ReadRequestPooled reads into a reused buffer.
const PooledRequestFrame = 4<<20 + 64<<10

// ReadRequestPooled is ReadRequest with a binary request's frame (up to
// PooledRequestFrame bytes) read into a reused buffer: its reader calls
// req.Release once nothing uses req.Payload (or req.Body) any more; a
// request it does not release is left to the garbage collector.
func ReadRequestPooled(r io.Reader, req *Request) error {
	n, bin, err := readHeader(r)
	if err != nil {
		return err
	}
	if !bin || n > PooledRequestFrame {
		b, err := readBody(r, n)
		if err != nil {
			return err
		}
		return decodeRequest(b, bin, req)
	}
	bp := requestBufs.Get().(*[]byte)
	b := (*bp)[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		requestBufs.Put(bp)
		return fmt.Errorf("agentproto: short frame: %w", err)
	}
	if err := decodeRequest(b, bin, req); err != nil {
		requestBufs.Put(bp)
		return err
	}
	req.pooled = bp
	return nil
}

// Release gives back the buffer of a request read by ReadRequestPooled
// (its Payload must not be used after); a no-op for any other request.
func (r *Request) Release() {
	if r.pooled != nil {
		requestBufs.Put(r.pooled)
		r.pooled, r.Payload = nil, nil
	}
}

// decodeRequest decodes a request frame's body b: JSON, or binary (the
// JSON's length, the JSON, then the Payload, which stays in b).
func decodeRequest(b []byte, bin bool, req *Request) error {
	if bin {
		n := len(b)
		if n < 4 {
			return fmt.Errorf("agentproto: binary request of %d bytes", n)
		}
		jn := int(binary.BigEndian.Uint32(b))
		if jn > n-4 {
			return fmt.Errorf("agentproto: binary request's JSON of %d bytes exceeds its frame", jn)
		}
		if err := json.Unmarshal(b[4:4+jn], req); err != nil {
			return fmt.Errorf("agentproto: decode: %w", err)
		}
		req.Payload = b[4+jn:]
		return nil
	}
	if err := json.Unmarshal(b, req); err != nil {
		return fmt.Errorf("agentproto: decode: %w", err)
	}
	return nil
}

// chunkBufs holds the buffers of binary chunks (a frame of up to
// BulkChunkSize of data) that the Client reads.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 9+BulkChunkSize); return &b }}

// readResponsePooled is ReadResponse with a binary chunk of up to
// BulkChunkSize read into a buffer of chunkBufs (resp.pooled): a bulk call
// puts it back once its consumer returned, every other call leaves it to
// the garbage collector (its consumer may keep Data).
func readResponsePooled(r io.Reader, resp *Response) error {
	n, bin, err := readHeader(r)
	if err != nil {
		return err
	}
	if !bin || n < 9 || n > 9+BulkChunkSize {
		b, err := readBody(r, n)
		if err != nil {
			return err
		}
		return decodeResponse(b, bin, resp)
	}
	bp := chunkBufs.Get().(*[]byte)
	b := (*bp)[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		chunkBufs.Put(bp)
		return fmt.Errorf("agentproto: short frame: %w", err)
	}
	*resp = Response{ID: binary.BigEndian.Uint64(b), Kind: KindChunk, Stream: byteStream(b[8]), Data: b[9:], pooled: bp}
	return nil
}

// SocketBuffer is the send buffer asked for each end of an agent
// connection (a Unix socket, whose sender's buffer bounds the bytes in
// flight): a 4 MiB upload frame, or several 1 MiB chunks, fit in it, so
// the writer does not wait for the reader to be scheduled every 200 KiB
// (the default). The kernel caps it at net.core.wmem_max.
const SocketBuffer = 4 << 20

// SizeBuffers sizes c's socket buffers (SocketBuffer) when it is a Unix
// socket; best effort.
func SizeBuffers(c net.Conn) {
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.SetWriteBuffer(SocketBuffer)
		_ = uc.SetReadBuffer(SocketBuffer)
	}
}
