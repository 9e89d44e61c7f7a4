# warren: see README.md. The two commands: `make run` and `make test`.
GO        ?= go
BIN       := bin
DATA_DIR  ?= /var/lib/warren
LISTEN    ?= 127.0.0.1:7070
E2B_LISTEN ?= 127.0.0.1:3000
export CGO_ENABLED := 0

.PHONY: all deps build run test test-go test-python bench images debian-image vm-kernel vm-disk vm-image lint fmt clean e2b-proto

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

# The microvm tier's guest kernel (internal/runtime/microvm), from the Debian
# mirror; cached, fetched again only when the mirror has a newer one.
vm-kernel:
	@bash scripts/vm-kernel.sh $(DATA_DIR)/cache/vm-kernel

# The vm tier's test disk image (internal/runtime/vm): Debian 12 with its own
# kernel, GRUB and systemd, warren-agent installed as a systemd service; built
# with debootstrap from the apt sources' mirror, cached, rebuilt only when its
# inputs (build steps, packages, mirror, the agent) change.
vm-disk: build
	@bash scripts/vm-disk.sh $(DATA_DIR)/cache/vm-disk $(BIN)/warren-agent >/dev/null

# ...imported into the node's store as debian:12-vm (`tier: "vm"` sandboxes).
vm-image: vm-disk
	@$(BIN)/warren image import --disk $(DATA_DIR)/cache/vm-disk/debian-12.raw --name debian:12-vm --data-dir $(DATA_DIR)

run: deps build debian-image vm-image
	$(BIN)/warren serve --data-dir $(DATA_DIR) --listen $(LISTEN) --e2b-listen $(E2B_LISTEN)

test: deps build vm-kernel vm-disk
	@bash scripts/test.sh

bench: deps build
	$(BIN)/warren bench --out docs/benchmarks-history.csv

# E2B's envd services (api/e2b/): the generated code is checked in; this
# regenerates it (protoc from Debian's protobuf-compiler, pinned plugins).
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION ?= v1.19.1
e2b-proto:
	@mkdir -p $(BIN)/protoc
	GOBIN=$(abspath $(BIN))/protoc $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(abspath $(BIN))/protoc $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
	PATH=$(abspath $(BIN))/protoc:$$PATH protoc -I api/e2b -I /usr/include --go_out=api/e2b --go_opt=paths=source_relative \
		--connect-go_out=api/e2b --connect-go_opt=paths=source_relative api/e2b/filesystem/filesystem.proto api/e2b/process/process.proto

lint:
	@test -z "$$(gofmt -l . | grep -v '^sdk/python')" || (gofmt -l .; exit 1)
	$(GO) vet ./...

fmt:
	gofmt -w .

clean:
	rm -rf $(BIN)
