# warren: see README.md. The two commands: `make run` and `make test`.
GO        ?= go
BIN       := bin
DATA_DIR  ?= /var/lib/warren
LISTEN    ?= 127.0.0.1:7070
E2B_LISTEN ?= 127.0.0.1:3000
export CGO_ENABLED := 0

.PHONY: all deps build run test test-go test-python bench images debian-image lint fmt clean

all: build

deps:
	@bash scripts/install-deps.sh

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/warren ./cmd/warren
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/warren-agent ./cmd/warren-agent

debian-image: build
	@bash scripts/build-debian-image.sh $(DATA_DIR)/cache/debian-12.tar
	@$(BIN)/warren image import $(DATA_DIR)/cache/debian-12.tar --name debian:12 --data-dir $(DATA_DIR)

run: deps build debian-image
	$(BIN)/warren serve --data-dir $(DATA_DIR) --listen $(LISTEN) --e2b-listen $(E2B_LISTEN)

test: deps build
	@bash scripts/test.sh

bench: deps build
	$(BIN)/warren bench --out docs/BENCHMARKS.md

lint:
	@test -z "$$(gofmt -l . | grep -v '^sdk/python')" || (gofmt -l .; exit 1)
	$(GO) vet ./...

fmt:
	gofmt -w .

clean:
	rm -rf $(BIN)
