# dlock — two commands do all the set-up on a fresh machine (Go + apt):
#   make demo   the inventory/oversell story and friends, on throwaway local servers
#   make test   the whole suite (installs redis-server, etcd, zookeeper, postgresql when missing),
#               lint (go vet, staticcheck) and modcheck (every module installs from a module proxy)

SHELL := /bin/bash
GO ?= go
# Every module of the workspace.
MODULES := $(shell $(GO) work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
# Every package of every module: one go command covers the workspace.
PKGS := $(addsuffix /...,$(MODULES))
TESTFLAGS ?= -race -count=1 -timeout 20m
# Test packages run at once, whatever module they are in. The tests mostly
# wait on servers and timers (about a fifth of 2 cores busy); 3 at a time
# starved lease renewals at load 15, so 2.
TESTP ?= 2
# staticcheck 2026.2.2, fetched through the module proxy (checked with Go 1.26).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test servers fmt-check vet lint cross unit modcheck tidy demo bench verify-replicated

test: servers fmt-check lint unit modcheck

servers:
	@bash scripts/install-servers.sh

fmt-check:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	@echo "go vet $(MODULES)"; $(GO) vet $(PKGS)

# lint: go vet and staticcheck (default checks) over every module, and the
# dlock command built for Windows and macOS (it must install there too).
lint: vet cross
	@echo "staticcheck $(MODULES)"; $(GO) run $(STATICCHECK) $(PKGS)

cross:
	@echo "go build ./cmd/dlock for windows, darwin"; for os in windows darwin; do GOOS=$$os $(GO) build -o /dev/null ./cmd/dlock || exit 1; done

unit:
	@echo "go test -p $(TESTP) $(MODULES)"; $(GO) test $(TESTFLAGS) -p $(TESTP) $(PKGS)

# modcheck: every module installs from a file proxy built from a tagged copy
# of the working tree (scripts/modcheck.sh, docs/RELEASING.md).
modcheck:
	@bash scripts/modcheck.sh

# tidy: go mod tidy in every module (or M=dir) before this repository's
# versions are published.
tidy:
	@bash scripts/modcheck.sh tidy $(M)

demo: servers
	@cd cmd/dlock && $(GO) run . demo

bench:
	@cd bench && $(GO) run . -out ../docs/BENCHMARKS.md

# verify-replicated: the campaign of docs/GUARANTEES.md, "Replicated deployments", short by
# default (RUNS=1, DURATION=20s per row; the published rows used RUNS=5 DURATION=60s), into
# VERIFY_OUT (one directory per row). The rows and what each must show are in
# scripts/verify-replicated.sh.
RUNS ?= 1
DURATION ?= 20s
VERIFY_OUT ?= /tmp/dlock-verify-replicated
verify-replicated: servers
	@RUNS='$(RUNS)' DURATION='$(DURATION)' VERIFY_OUT='$(VERIFY_OUT)' GO='$(GO)' bash scripts/verify-replicated.sh
