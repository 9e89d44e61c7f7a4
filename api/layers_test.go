package api

import (
	"encoding/json"
	"testing"
)

func TestLayerAttachmentJSON(t *testing.T) {
	var req CreateSandboxRequest
	in := `{"image":"debian:12","layers":["ws/django-1234@3",{"layer":"toolkit/harness","mount":"/opt/toolkit","protected":true}]}`
	if err := json.Unmarshal([]byte(in), &req); err != nil {
		t.Fatal(err)
	}
	if len(req.Layers) != 2 || req.Layers[0] != (LayerAttachment{Layer: "ws/django-1234@3"}) ||
		req.Layers[1] != (LayerAttachment{Layer: "toolkit/harness", Mount: "/opt/toolkit", Protected: true}) {
		t.Fatalf("%+v", req.Layers)
	}
	b, _ := json.Marshal(req.Layers)
	if string(b) != `["ws/django-1234@3",{"layer":"toolkit/harness","mount":"/opt/toolkit","protected":true}]` {
		t.Fatalf("round trip: %s", b)
	}
	for _, bad := range []string{`[1]`, `[null]`, `[{"layer":"x","extra":1}]`, `[["x"]]`, `[{"layer":5}]`} {
		var ls []LayerAttachment
		if err := json.Unmarshal([]byte(bad), &ls); err == nil {
			t.Errorf("%s accepted: %+v", bad, ls)
		}
	}
}

func FuzzLayerAttachment(f *testing.F) {
	for _, s := range []string{`"ws/x"`, `{"layer":"a","mount":"/b"}`, `{}`, `""`, `{"layer":"a","protected":true}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var a LayerAttachment
		if json.Unmarshal([]byte(s), &a) != nil {
			return
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var back LayerAttachment
		if err := json.Unmarshal(b, &back); err != nil || back != a {
			t.Fatalf("%s -> %s -> %+v (%v)", s, b, back, err)
		}
	})
}
