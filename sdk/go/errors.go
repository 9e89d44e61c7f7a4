package warren

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/warrenhq/warren/api"
)

// APIError is an error answer of the server: the HTTP status and the
// {"error":{"code","message"}} body.
type APIError struct {
	Status  int
	Code    string
	Message string
	// Reason names the short resource of a 503 (api.ReasonCPU, …), or "".
	Reason string
	// Divergence is set on a 409 from a resumed trajectory: the step and
	// both operations.
	Divergence *api.Divergence
}

func (e *APIError) Error() string {
	return fmt.Sprintf("warren: %s (%d): %s", e.Code, e.Status, e.Message)
}

// Unwrap exposes the wire error, so errors.As(err, new(*api.Error)) works.
func (e *APIError) Unwrap() error {
	return &api.Error{Code: e.Code, Message: e.Message, Reason: e.Reason, Diverge: e.Divergence}
}

// codeForStatus gives the error code a status maps to, for answers without
// a JSON error body (a proxy, a panic).
func codeForStatus(status int) string { return api.CodeForStatus(status) }

// statusForCode is the inverse of codeForStatus, used for errors that arrive
// inside an NDJSON stream (after a 200 header).
func statusForCode(code string) int { return api.HTTPStatus(code) }

// readError consumes resp's body and closes it.
func readError(resp *http.Response) *APIError {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{Status: resp.StatusCode}
	var body api.ErrorBody
	if err := json.Unmarshal(b, &body); err == nil && body.Error.Code != "" {
		e.Code, e.Message, e.Reason, e.Divergence = body.Error.Code, body.Error.Message, body.Error.Reason, body.Error.Diverge
		return e
	}
	e.Code = codeForStatus(resp.StatusCode)
	e.Message = strings.TrimSpace(string(b))
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// CodeOf returns the API error code of err, or "" when err is not an APIError.
func CodeOf(err error) string {
	var e *APIError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// StatusOf returns the HTTP status of err, or 0 when err is not an APIError.
func StatusOf(err error) int {
	var e *APIError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func IsBadRequest(err error) bool      { return CodeOf(err) == api.CodeBadRequest }
func IsUnauthorized(err error) bool    { return CodeOf(err) == api.CodeUnauthorized }
func IsForbidden(err error) bool       { return CodeOf(err) == api.CodeForbidden }
func IsNotFound(err error) bool        { return CodeOf(err) == api.CodeNotFound }
func IsConflict(err error) bool        { return CodeOf(err) == api.CodeConflict }
func IsTooLarge(err error) bool        { return CodeOf(err) == api.CodeTooLarge }
func IsInvalid(err error) bool         { return CodeOf(err) == api.CodeInvalid }
func IsTooManyRequests(err error) bool { return CodeOf(err) == api.CodeTooManyRequests }
func IsUnavailable(err error) bool     { return CodeOf(err) == api.CodeUnavailable }
func IsTimeout(err error) bool         { return CodeOf(err) == api.CodeTimeout }
