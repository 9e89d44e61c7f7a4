#!/usr/bin/env bash
# The whole test suite: Go (unit, integration, e2e against the real binary),
# then the Python SDK against a real `warren serve`. Afterwards it checks
# that nothing of warren's is left on the host.
set -uo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
# The e2e suite fails, rather than skips, where it cannot run as root.
export WARREN_REQUIRE_ROOT=1
# A program built with -race sleeps 1 s at exit by default (to let other
# goroutines report): a second per test binary and per e2e server stopped.
export GORACE="atexit_sleep_ms=0"
status=0
# Each phase is announced with the seconds since the start (docs/BENCHMARKS.md,
# "The test suite").
phase() { echo "== $1 (at ${SECONDS} s)"; }

phase "gofmt / go vet"
if [ -n "$(gofmt -l $(git ls-files '*.go') 2>/dev/null)" ]; then
  echo "gofmt needed:"; gofmt -l $(git ls-files '*.go'); status=1
fi
go vet ./... || status=1

phase "go test"
go test -count=1 -timeout 20m -p 2 $(go list ./... | grep -v '/test/e2e$') || status=1

# The race detector needs cgo (gcc): where it cannot run, this fails.
# These packages test the node's and the control plane's logic in one
# process, the edge on the fake runtime (internal/runtime/fake) included.
phase "go test -race (unit tests)"
CGO_ENABLED=1 go test -race -count=1 -timeout 10m -p 2 \
  ./internal/edge/... ./internal/apiserver/ ./internal/bus/ ./internal/dataplane/ ./internal/agentproto/ \
  ./internal/placement/ ./internal/watcher/ ./internal/iam/ ./internal/runtime/fake/ || status=1

# The e2e suite runs once, under the race detector: the test process and
# every `warren serve` it starts (WARREN_E2E_RACE; the agent stays static).
# A server's race report fails its test. Its tests that start their own
# servers and need a quiet host for nothing (test/e2e/harness_test.go,
# parallel) run 3 at a time once the others have ended.
phase "e2e (-race)"
CGO_ENABLED=1 WARREN_E2E_RACE=1 go test -race -count=1 -parallel 3 -timeout 40m ./test/e2e/ || status=1

phase "python SDK"
if [ -d sdk/python/tests ]; then
  (cd sdk/python && python3 -m unittest discover -s tests -t . -v 2>&1 | tail -n 40; exit "${PIPESTATUS[0]}") || status=1
fi

phase "leak check"
bash scripts/leakcheck.sh || status=1
phase "end"
exit $status
