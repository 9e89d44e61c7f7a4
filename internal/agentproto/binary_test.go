package agentproto

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestBinaryFrames(t *testing.T) {
	var b bytes.Buffer
	data := bytes.Repeat([]byte{0, 1, 2, 255}, 1000)
	if err := WriteChunk(&b, 7, StreamStderr, data); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(&b, &Response{ID: 7, Kind: KindDone, Body: json.RawMessage(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	var r Response
	if err := ReadResponse(&b, &r); err != nil || r.ID != 7 || r.Kind != KindChunk || r.Stream != StreamStderr || !bytes.Equal(r.Data, data) {
		t.Fatalf("binary chunk: %+v %v", r, err)
	}
	if err := ReadResponse(&b, &r); err != nil || r.Kind != KindDone || string(r.Body) != `{"x":1}` {
		t.Fatalf("JSON after it: %+v %v", r, err)
	}
	for _, req := range []*Request{
		{ID: 3, Op: OpFileWrite, Body: json.RawMessage(`{"path":"/a"}`), Payload: data},
		{ID: 4, Op: OpFileWrite, Body: json.RawMessage(`{"path":"/a"}`), Payload: []byte{}},
		{ID: 5, Op: OpExec, Body: json.RawMessage(`{}`), Window: Window, Binary: true},
	} {
		b.Reset()
		if err := WriteRequestFrame(&b, req); err != nil {
			t.Fatal(err)
		}
		var got Request
		if err := ReadRequest(&b, &got); err != nil || got.ID != req.ID || got.Op != req.Op || string(got.Body) != string(req.Body) ||
			!bytes.Equal(got.Payload, req.Payload) || (req.Payload != nil) != (got.Payload != nil) || got.Window != req.Window || got.Binary != req.Binary {
			t.Fatalf("request %d: %+v %v", req.ID, got, err)
		}
	}
	// A length past MaxFrame is refused, binary or not.
	b.Reset()
	b.Write([]byte{0x80, 0xff, 0xff, 0xff})
	if err := ReadResponse(&b, &r); err == nil {
		t.Fatal("an oversized binary frame was read")
	}
}
