package agentproto

import (
	"context"
	"encoding/json"
	"net"
	"runtime"
	"testing"
)

// fakeReader answers the first request on conn with chunks binary chunks
// of 1 MiB within the call's window, then a done frame, as an agent
// answers a file read.
func fakeReader(t *testing.T, conn net.Conn, chunks int) {
	t.Helper()
	go func() {
		var req Request
		if err := ReadRequest(conn, &req); err != nil {
			return
		}
		data := make([]byte, BulkChunkSize)
		avail := req.Window // the credit, as the agent keeps it
		for range chunks {
			for avail <= 0 {
				var cr Request
				var credit CreditRequest
				if ReadRequest(conn, &cr) != nil || json.Unmarshal(cr.Body, &credit) != nil {
					return
				}
				avail += credit.Bytes
			}
			if WriteChunk(conn, req.ID, StreamData, data) != nil {
				return
			}
			avail -= BulkChunkSize + FrameCost
		}
		_ = WriteFrame(conn, &Response{ID: req.ID, Kind: KindDone})
		// Credits and the like until the end.
		for ReadRequest(conn, &req) == nil {
		}
	}()
}

// TestBulkReadReusesBuffers: a CallBulk read of many 1 MiB chunks
// allocates far less than it reads (the chunks' buffers are reused).
func TestBulkReadReusesBuffers(t *testing.T) {
	const chunks = 64 // 64 MiB
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	fakeReader(t, b, chunks)
	c := NewClient(a)
	defer c.Close()
	var got int
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := c.CallBulk(context.Background(), OpFileRead, &PathRequest{Path: "/big"}, nil, func(r *Response) error {
		got += len(r.Data)
		return nil
	})
	runtime.ReadMemStats(&after)
	if err != nil || got != chunks*BulkChunkSize {
		t.Fatalf("read %d bytes, %v", got, err)
	}
	// The window lets at most a few chunks be in flight: their buffers,
	// and some slack, are all a read of any length allocates (≤ 16 MiB
	// here; the race detector's own allocations add ~6 MiB). A buffer per
	// chunk allocates the whole 64 MiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32*BulkChunkSize {
		t.Fatalf("a %d MiB bulk read allocated %d MiB", chunks, alloc>>20)
	}
}

// TestPayloadReadReusesBuffers: the agent's reads of 4 MiB upload writes
// (binary requests with a payload) reuse their buffers once released:
// 64 of them allocate far less than the 256 MiB they carry.
func TestPayloadReadReusesBuffers(t *testing.T) {
	const writes, size = 64, 4 << 20
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	payload := make([]byte, size)
	go func() {
		for i := range writes {
			req := &Request{ID: uint64(i + 1), Op: OpFileWrite, Body: json.RawMessage(`{"path":"/f","at":true}`), Payload: payload}
			if WriteRequestFrame(a, req) != nil {
				return
			}
		}
	}()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got := 0
	for range writes {
		var req Request
		if err := ReadRequestPooled(b, &req); err != nil {
			t.Fatal(err)
		}
		got += len(req.Payload)
		req.Release()
	}
	runtime.ReadMemStats(&after)
	if got != writes*size {
		t.Fatalf("read %d payload bytes, want %d", got, writes*size)
	}
	// A buffer per read allocates all 256 MiB; reused, a few buffers.
	// Under the race detector sync.Pool drops a quarter of the buffers
	// given back (~16 of 64): still far from a buffer per read.
	limit := uint64(8 * size)
	if raceOn {
		limit = 40 * size
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > limit {
		t.Fatalf("%d payload reads of %d MiB allocated %d MiB", writes, size>>20, alloc>>20)
	}
}
