# kvfabric: build, test, benchmark and regenerate wire types.
# Everything a target needs on a fresh Debian machine it installs itself.

GO       ?= go
BIN      := bin/kvfabric
GOBIN    := $(shell $(GO) env GOPATH)/bin
PROTOS   := $(shell git ls-files '*.proto' 2>/dev/null)
# protoc-gen-go matches the protobuf runtime in go.mod.
PROTOBUF_VERSION := $(shell $(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
APT      := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends

.PHONY: all build demo test test-deps test-long bench bench-deps proto proto-deps lint fuzz clean help

all: build

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

build: ## compile bin/kvfabric
	$(GO) build -o $(BIN) ./cmd/kvfabric

demo: build ## run a 3-node cluster on loopback and move blocks across TP sizes, every byte checked
	$(GO) run ./testbed/demo --bin $(BIN)

test: test-deps ## vet, then every test with the race detector in random order
	$(GO) vet ./...
	$(GO) test -race -shuffle=on -timeout 12m ./...

test-deps: ## install what the tests build against (gcc, rdma-core's verbs.h for softverbs)
	@dpkg -s libibverbs-dev >/dev/null 2>&1 || { apt-get update -q && $(APT) libibverbs-dev gcc; }

test-long: ## the long suites (-kvfabric.long) of the packages that have them; about 15 minutes
	$(GO) test -count=1 -timeout 40m ./membership ./pool ./fabric ./testbed/launch ./testbed/netns -kvfabric.long

bench: bench-deps ## run the benchmarks with their baselines (figures go to BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -count 1 -timeout 30m ./...

bench-deps: ## install what the baselines need (gcc, libxxhash-dev for the C hash reference)
	@dpkg -s libxxhash-dev >/dev/null 2>&1 || { apt-get update -q && $(APT) libxxhash-dev gcc; }

fuzz: ## fuzz the layout decoder for a minute
	$(GO) test ./layout -run '^$$' -fuzz FuzzUnmarshal -fuzztime 60s

proto: proto-deps ## regenerate *.pb.go from the .proto sources
	PATH="$(GOBIN):$$PATH" protoc -I . --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative $(PROTOS)

proto-deps:
	@command -v protoc >/dev/null 2>&1 || { apt-get update -q && $(APT) protobuf-compiler; }
	@test -x $(GOBIN)/protoc-gen-go || $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOBUF_VERSION)
	@test -x $(GOBIN)/protoc-gen-go-grpc || $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

lint: ## gofmt, vet, a build without cgo, and no tracked file over 1 MiB
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...
	@big=$$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576'); \
	if [ -n "$$big" ]; then echo "tracked files over 1 MiB (build outputs or data belong outside git):"; echo "$$big"; exit 1; fi

clean: ## remove build outputs
	rm -rf bin
