# kvfabric: build, test, benchmark and regenerate wire types.
# Everything a target needs on a fresh Debian machine it installs itself.

GO       ?= go
BIN      := bin/kvfabric
GOBIN    := $(shell $(GO) env GOPATH)/bin
PROTOS   := $(shell git ls-files '*.proto' 2>/dev/null)
# protoc-gen-go matches the protobuf runtime in go.mod.
PROTOBUF_VERSION := $(shell $(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# staticcheck 2026.2.2, a release that supports the Go of go.mod (1.26).
STATICCHECK_VERSION := v0.8.2
APT      := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
# The Python client's tests run on Debian's interpreter, where its packages
# (python3-grpcio and the rest) install; another interpreter with grpcio,
# protobuf, numpy, xxhash and pytest may be named instead.
PYTHON   ?= /usr/bin/python3
PY_DEBS  := python3-grpcio python3-protobuf python3-numpy python3-xxhash python3-pytest
# The checks of the Python client, and what the README's install line needs
# (a venv on Debian's packages, built offline with Debian's setuptools).
PY_DEBS  += python3-mypy python3-flake8 python3-venv python3-setuptools
# Stubs of the protos the Python client speaks, in its own namespace.
PY_PB    := python/kvfabric/_pb
PY_PROTOS := layout/layoutpb/layout.proto fabric/fabricpb/engine.proto

.PHONY: all build demo test test-go test-python test-deps python-deps test-long bench bench-deps proto proto-deps lint fuzz clean help
.PHONY: engines-venv test-engines

all: build

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

build: ## compile bin/kvfabric
	$(GO) build -o $(BIN) ./cmd/kvfabric

demo: build ## run a 3-node cluster on loopback and move blocks across TP sizes, every byte checked
	$(GO) run ./testbed/demo --bin $(BIN)

test: test-go test-python ## every Go and Python test (CI); make test-engines adds the real vLLM and SGLang

test-go: test-deps ## vet, then every Go test with the race detector in random order
	$(GO) vet ./...
	$(GO) test -race -shuffle=on -timeout 12m ./...

test-python: build python-deps ## flake8 and mypy, then the Python client's tests (the README's install line among them), against agents of bin/kvfabric
	cd python && $(PYTHON) -m flake8 kvfabric tests examples
	cd python && $(PYTHON) -m mypy --cache-dir=/dev/null
	cd python && KVFABRIC_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider tests

python-deps: ## install the Python client's Debian packages; no interpreter is an error
	@command -v $(PYTHON) >/dev/null 2>&1 || \
		{ echo "no Python interpreter $(PYTHON) (apt-get install python3, or make PYTHON=...)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "$(PYTHON) is Python $$($(PYTHON) -c 'import platform; print(platform.python_version())'); the client needs 3.11 or later"; exit 1; }
	@$(PYTHON) -c 'import grpc, google.protobuf, numpy, xxhash, pytest, mypy, flake8, setuptools' 2>/dev/null && \
		{ ! command -v dpkg >/dev/null 2>&1 || dpkg -s python3-venv >/dev/null 2>&1; } || \
		{ apt-get update -q && $(APT) $(PY_DEBS); }

# The engines (vLLM, SGLang) live in virtual environments outside the
# repository, one each: they pin different torch versions. PyPI's Linux torch
# wheels bundle CUDA, so each is several GiB; the tests use the CPU only.
ENGINES_VENV   ?= $(HOME)/.cache/kvfabric/engines-venv
VLLM_VERSION   := 0.33.0
SGLANG_VERSION := 0.5.23
UV_VERSION     := 0.13.9
ENGINE_PY_DEPS := grpcio protobuf numpy xxhash pytest
UV             := $(ENGINES_VENV)/uv/bin/uv

engines-venv: python-deps ## install vLLM and SGLang into venvs under $(ENGINES_VENV) (about 19 GiB, 4 minutes)
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { apt-get update -q && $(APT) python3-venv; }
	@test -x $(UV) || { $(PYTHON) -m venv $(ENGINES_VENV)/uv && $(ENGINES_VENV)/uv/bin/pip install -q uv==$(UV_VERSION); }
	@$(ENGINES_VENV)/vllm/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm") != "$(VLLM_VERSION)")' 2>/dev/null || { \
		$(UV) venv -q --allow-existing --python $(PYTHON) $(ENGINES_VENV)/vllm && \
		$(UV) pip install -q --python $(ENGINES_VENV)/vllm/bin/python vllm==$(VLLM_VERSION) $(ENGINE_PY_DEPS); }
	@$(ENGINES_VENV)/sglang/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("sglang") != "$(SGLANG_VERSION)")' 2>/dev/null || { \
		$(UV) venv -q --allow-existing --python $(PYTHON) $(ENGINES_VENV)/sglang && \
		$(UV) pip install -q --python $(ENGINES_VENV)/sglang/bin/python sglang==$(SGLANG_VERSION) $(ENGINE_PY_DEPS); }

test-engines: build engines-venv ## the vLLM connector and SGLang backend tests against the real engines (installs them first)
	cd python && KVFABRIC_BIN=$(CURDIR)/$(BIN) $(ENGINES_VENV)/vllm/bin/python -m pytest -q -p no:cacheprovider tests_engines/test_vllm_real.py
	cd python && KVFABRIC_BIN=$(CURDIR)/$(BIN) $(ENGINES_VENV)/sglang/bin/python -m pytest -q -p no:cacheprovider tests_engines/test_sglang_real.py

test-deps: ## install what the tests build against (gcc, rdma-core's verbs.h for softverbs, libfabric and its headers)
	@dpkg -s libibverbs-dev >/dev/null 2>&1 || { apt-get update -q && $(APT) libibverbs-dev gcc; }
	@dpkg -s libfabric-dev >/dev/null 2>&1 || { apt-get update -q && $(APT) libfabric-dev libfabric1; }

test-long: ## the long suites (-kvfabric.long) of the packages that have them; about 7 minutes
	$(GO) test -count=1 -timeout 40m ./membership ./pool ./fabric ./testbed/launch ./testbed/netns -kvfabric.long

bench: bench-deps test-deps ## run the benchmarks with their baselines (figures go to BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -count 1 -timeout 30m ./...

bench-deps: ## install what the baselines need (gcc, libxxhash-dev for the C hash reference)
	@dpkg -s libxxhash-dev >/dev/null 2>&1 || { apt-get update -q && $(APT) libxxhash-dev gcc; }

fuzz: ## fuzz the layout decoder for a minute
	$(GO) test ./layout -run '^$$' -fuzz FuzzUnmarshal -fuzztime 60s

proto: proto-deps ## regenerate *.pb.go, and the Python client's stubs, from the .proto sources
	PATH="$(GOBIN):$$PATH" protoc -I . --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative $(PROTOS)
	protoc -I . --python_out=$(PY_PB) --pyi_out=$(PY_PB) $(PY_PROTOS)
	protoc -I . --grpc_python_out=$(PY_PB) --plugin=protoc-gen-grpc_python=$$(command -v grpc_python_plugin) \
		fabric/fabricpb/engine.proto
	@# The stubs import each other by proto path; in the package they live
	@# under kvfabric._pb (a top-level "fabric" collides with Debian's).
	sed -i -E 's/^(from|import) (layout|fabric)\.([a-z]+)( import|$$)/\1 kvfabric._pb.\2.\3\4/' \
		$$(find $(PY_PB) -name '*_pb2*.py' -o -name '*_pb2.pyi')

proto-deps:
	@command -v protoc >/dev/null 2>&1 || { apt-get update -q && $(APT) protobuf-compiler; }
	@command -v grpc_python_plugin >/dev/null 2>&1 || { apt-get update -q && $(APT) protobuf-compiler-grpc; }
	@test -x $(GOBIN)/protoc-gen-go || $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOBUF_VERSION)
	@test -x $(GOBIN)/protoc-gen-go-grpc || $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

lint: ## gofmt, vet, staticcheck, a build and vet (tests too) without cgo, and no tracked file over 1 MiB
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@test -x $(GOBIN)/staticcheck && $(GOBIN)/staticcheck -version | grep -q '($(STATICCHECK_VERSION:v%=%))' || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(GOBIN)/staticcheck ./...
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) vet ./...
	@big=$$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576'); \
	if [ -n "$$big" ]; then echo "tracked files over 1 MiB (build outputs or data belong outside git):"; echo "$$big"; exit 1; fi

clean: ## remove build outputs
	rm -rf bin

# The stand-ins' strictness, tested, and the real-GPU check.
.PHONY: mutation-check gpu-check gpu-check-build cuda-header-check
GPU_CHECK_DIR := bin/gpu-check

mutation-check: test-deps python-deps ## the mutation check: plant every bug listed (internal/mutation/mutations.txt), each must be caught; about 40 minutes on 2 cores (the first run builds with -trimpath, minutes more)
	$(GO) run ./internal/mutation -p 2

gpu-check-build: ## build the agent and the real-GPU test binaries into bin/gpu-check, stripped (about 45 MB: copy it to a GPU machine without Go)
	mkdir -p $(GPU_CHECK_DIR)
	$(GO) build -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/kvfabric ./cmd/kvfabric
	$(GO) test -c -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/cuda.test ./pool/cuda
	$(GO) test -c -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/testbed.test ./testbed

gpu-check: ## on a machine with an NVIDIA GPU: every real-GPU test and benchmark, figures to bin/gpu-check/figures.txt; under 8 minutes
	@if command -v $(GO) >/dev/null 2>&1; then $(MAKE) --no-print-directory gpu-check-build; fi
	sh testbed/gpu-check.sh $(GPU_CHECK_DIR)

cuda-header-check: ## check pool/cuda's driver header against cuda.h from Debian's non-free nvidia-cuda-dev (a 774 MB download)
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	mkdir -p $$tmp/lists/partial && \
	echo 'deb http://deb.debian.org/debian bookworm main non-free' >$$tmp/sources.list && \
	o="-oDir::Etc::SourceList=$$tmp/sources.list -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists=$$tmp/lists" && \
	apt-get $$o update -q >/dev/null && (cd $$tmp && apt-get $$o download -q nvidia-cuda-dev) && \
	dpkg-deb --fsys-tarfile $$tmp/nvidia-cuda-dev_*.deb | tar -x -C $$tmp ./usr/include/cuda.h && \
	KVFABRIC_CUDA_H=$$tmp/usr/include/cuda.h $(GO) test -count=1 -v -run TestHeaderMatchesCudaH ./pool/cuda/softcuda

# kvfabric's TCP lane against NIXL and Mooncake on loopback; not in make test.
.PHONY: peers-bench
PEERS_VENV ?= $(HOME)/.cache/kvfabric/peers-venv

peers-bench: ## the TCP lane against NIXL (UCX over TCP) and Mooncake (TCP) between processes on loopback, 1 GiB x 3 rounds; installs both into $(PEERS_VENV) (about 6 GiB)
	PEERS_VENV=$(PEERS_VENV) GO=$(GO) bash testbed/peers-bench.sh
