#!/usr/bin/env bash
# The whole test suite: Go (unit, integration, e2e against the real binary),
# then the Python SDK against a real `warren serve`. Afterwards it checks
# that nothing of warren's is left on the host.
set -uo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
status=0

echo "== gofmt / go vet"
if [ -n "$(gofmt -l $(git ls-files '*.go') 2>/dev/null)" ]; then
  echo "gofmt needed:"; gofmt -l $(git ls-files '*.go'); status=1
fi
go vet ./... || status=1

echo "== go test"
go test -count=1 -timeout 20m -p 2 ./... || status=1

echo "== python SDK"
if [ -d sdk/python/tests ]; then
  (cd sdk/python && python3 -m unittest discover -s tests -t . -v 2>&1 | tail -n 40; exit "${PIPESTATUS[0]}") || status=1
fi

echo "== leak check"
bash scripts/leakcheck.sh || status=1
exit $status
