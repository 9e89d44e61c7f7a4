package imagebuild

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// Dockerfiles that cannot be built fail before the server is asked
// anything, with a ParseError that names the problem.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ df, want string }{
		{"", "no instructions"},
		{"RUN true\n", "the first instruction must be FROM"},
		{"FROM busybox\nFOO bar\n", "unknown instruction"},
		{"FROM busybox\nENV\n", "ENV"},
		{"FROM a AS x\nFROM b\n", "multi-stage"},
		{"FROM busybox\nRUN <<EOF\necho hi\nEOF\n", "here-document"},
		{"FROM busybox\nCOPY --from=x /a /b\n", "COPY --from"},
		{"FROM busybox\nRUN --network=none true\n", "RUN --network"},
		{"FROM busybox\nADD --checksum=sha256:00 a /b\n", "ADD --checksum"},
	} {
		_, err := Build(context.Background(), nil, Options{Dockerfile: []byte(tc.df), Tag: "t"})
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a ParseError with %q", tc.df, err, tc.want)
		}
	}
	if _, err := Build(context.Background(), nil, Options{Dockerfile: []byte("FROM x\n")}); err == nil || !strings.Contains(err.Error(), "tag") {
		t.Errorf("no tag: %v", err)
	}
}
