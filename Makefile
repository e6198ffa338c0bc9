GO      ?= go
PKGS    := ./...
BIN     := bin/kvfabric

.PHONY: all build test bench proto lint deps clean

all: build

## build: compile the kvfabric binary into bin/
build:
	$(GO) build -o $(BIN) ./cmd/kvfabric

## test: vet and run every test with the race detector, in random order
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -shuffle=on -timeout 10m $(PKGS)

## bench: run the benchmarks with their baselines (BENCHMARKS.md records the figures)
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 $(PKGS)

## lint: formatting and vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

clean:
	rm -rf bin
