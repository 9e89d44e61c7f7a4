package apiserver

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// FuzzCreateDecoding feeds arbitrary bodies through the create request's
// decoding and validation: it must never panic, and every refusal must be a
// client error with a message.
func FuzzCreateDecoding(f *testing.F) {
	for _, seed := range []string{
		`{"image":"busybox"}`, `{"image":"busybox","cpu":-1}`, `{"image":"a","env":{"A":"\u0000"}}`,
		`{"image":"x","labels":{"k":"v"},"ttl":1e308}`, `{`, `[]`, `null`, `{"image":"busybox"} {}`,
		`{"image":"../../x","memory_mb":9223372036854775807}`, `{"cpu":NaN}`,
		`{"image":"busybox","layers":["ws/x@3",{"layer":"toolkit/h","mount":"/opt/toolkit","protected":true}]}`,
		`{"image":"busybox","layers":[{"layer":"a","mount":"/proc/x"}]}`, `{"image":"b","layers":[1,null,"x@"]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", bytes.NewReader(body))
		var req api.CreateSandboxRequest
		err := decodeJSON(w, r, &req)
		if err == nil {
			if aerr := sandboxspec.Normalize(&req); aerr != nil {
				err = aerr
			}
		}
		if err == nil {
			if req.CPU <= 0 || req.MemoryMB <= 0 || req.TTL <= 0 || req.Image == "" || strings.Contains(req.Image, "..") {
				t.Fatalf("accepted an invalid spec: %+v", req)
			}
			return
		}
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Message == "" {
			t.Fatalf("refusal is not an API error: %v", err)
		}
		if st := StatusOf(ae.Code); st < 400 || st >= 500 {
			t.Fatalf("client input answered with status %d: %v", st, ae)
		}
	})
}

// FuzzCheckPath: accepted paths are absolute, clean, NUL-free and bounded.
func FuzzCheckPath(f *testing.F) {
	for _, seed := range []string{"/", "/a/../../b", "rel", "/a\x00b", "//x//y/", "/" + strings.Repeat("a", 5000)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p string) {
		clean, err := CheckPath(p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(clean, "/") || strings.Contains(clean, "\x00") || strings.Contains(clean, "/../") ||
			strings.HasSuffix(clean, "/..") || len(clean) > MaxPathLength {
			t.Fatalf("CheckPath(%q) accepted %q", p, clean)
		}
	})
}
