# dlock — two commands do all the set-up on a fresh machine (Go + apt):
#   make demo   the inventory/oversell story and friends, on throwaway local servers
#   make test   the whole suite (installs redis-server, etcd, zookeeper when missing)

SHELL := /bin/bash
GO ?= go
# Every module of the workspace.
MODULES := $(shell $(GO) work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
TESTFLAGS ?= -race -count=1 -timeout 20m

.PHONY: test servers fmt-check vet unit demo bench

test: servers fmt-check vet unit

servers:
	@bash scripts/install-servers.sh

fmt-check:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	@set -e; for m in $(MODULES); do echo "go vet $$m"; (cd $$m && $(GO) vet ./...); done

unit:
	@set -e; for m in $(MODULES); do echo "go test $$m"; (cd $$m && $(GO) test $(TESTFLAGS) ./...); done

demo: servers
	@cd cmd/dlock && $(GO) run . demo

bench:
	@cd bench && $(GO) run . -out ../docs/BENCHMARKS.md
