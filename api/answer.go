package api

import (
	"encoding/json"
	"errors"
)

// AnswerBody is the body of a call's last frame, as the bus and the data
// plane send it: for err, the error as JSON (an *Error keeps its code, any
// other error is internal) and failed; else out as JSON (a
// json.RawMessage as it is, nothing for nil), or the internal error of
// encoding it.
func AnswerBody(out any, err error) (body []byte, failed bool) {
	if err != nil {
		var ae *Error
		if !errors.As(err, &ae) {
			ae = &Error{Code: CodeInternal, Message: err.Error()}
		}
		body, _ = json.Marshal(ae)
		return body, true
	}
	if out == nil {
		return nil, false
	}
	if raw, ok := out.(json.RawMessage); ok {
		return raw, false
	}
	if body, err = json.Marshal(out); err != nil {
		body, _ = json.Marshal(&Error{Code: CodeInternal, Message: "encode answer: " + err.Error()})
		return body, true
	}
	return body, false
}
