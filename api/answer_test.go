package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
)

func TestAnswerBody(t *testing.T) {
	cases := []struct {
		name       string
		out        any
		err        error
		body       string
		wantFailed bool
	}{
		{"api error keeps its code", nil, fmt.Errorf("wrapped: %w", &Error{Code: CodeNotFound, Message: "no such sandbox"}), `{"code":"not_found","message":"no such sandbox"}`, true},
		{"other error is internal", nil, errors.New("disk on fire"), `{"code":"internal","message":"disk on fire"}`, true},
		{"raw JSON as it is", json.RawMessage(`{"a":1}`), nil, `{"a":1}`, false},
		{"value as JSON", map[string]int{"b": 2}, nil, `{"b":2}`, false},
		{"nothing", nil, nil, ``, false},
		{"unencodable answer", make(chan int), nil, `{"code":"internal","message":"encode answer: json: unsupported type: chan int"}`, true},
	}
	for _, c := range cases {
		body, failed := AnswerBody(c.out, c.err)
		if string(body) != c.body || failed != c.wantFailed {
			t.Errorf("%s: got %s failed=%v, want %s failed=%v", c.name, body, failed, c.body, c.wantFailed)
		}
	}
}
