package api

import "net/http"

// codeStatus maps each error code to its HTTP status.
var codeStatus = map[string]int{
	CodeBadRequest:      http.StatusBadRequest,
	CodeUnauthorized:    http.StatusUnauthorized,
	CodeForbidden:       http.StatusForbidden,
	CodeNotFound:        http.StatusNotFound,
	CodeConflict:        http.StatusConflict,
	CodeTooLarge:        http.StatusRequestEntityTooLarge,
	CodeInvalid:         http.StatusUnprocessableEntity,
	CodeTooManyRequests: http.StatusTooManyRequests,
	CodeInternal:        http.StatusInternalServerError,
	CodeBadGateway:      http.StatusBadGateway,
	CodeUnavailable:     http.StatusServiceUnavailable,
	CodeTimeout:         http.StatusGatewayTimeout,
}

// HTTPStatus is the status an error code is answered with (500 for unknown codes).
func HTTPStatus(code string) int {
	if s, ok := codeStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// CodeForStatus is the error code of a status, for answers without a JSON
// error body (a proxy in between, say: its 502 means the service behind it
// is not available, hence unavailable, not bad_gateway, which warren
// answers with a body when a sandbox's port does not).
func CodeForStatus(status int) string {
	if status == http.StatusBadGateway {
		return CodeUnavailable
	}
	for c, s := range codeStatus {
		if s == status {
			return c
		}
	}
	return CodeInternal
}
