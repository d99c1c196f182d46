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

.PHONY: test servers fmt-check vet lint unit modcheck tidy demo bench verify-replicated

test: servers fmt-check lint unit modcheck

servers:
	@bash scripts/install-servers.sh

fmt-check:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	@echo "go vet $(MODULES)"; $(GO) vet $(PKGS)

# lint: go vet and staticcheck (default checks) over every module.
lint: vet
	@echo "staticcheck $(MODULES)"; $(GO) run $(STATICCHECK) $(PKGS)

unit:
	@echo "go test -p $(TESTP) $(MODULES)"; $(GO) test $(TESTFLAGS) -p $(TESTP) $(PKGS)

# modcheck: every module installs from a file proxy built from a tagged copy
# of the working tree, offline (scripts/modcheck.sh, docs/RELEASING.md).
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
# VERIFY_OUT (one directory per row, each with its report.md, histories and HTML timelines).
# Every deployment × fault, then the positive controls (?weaken=forget: a lock that releases
# every grant at once), which must FAIL. It fails when a positive control passes or an etcd,
# ZooKeeper or Redlock row does not pass; Sentinel and Cluster rows are reported, not asserted
# (a failover may lose a lock). leader-partition rows need Linux, root and the ip command and
# are skipped without them.
RUNS ?= 1
DURATION ?= 20s
VERIFY_OUT ?= /tmp/dlock-verify-replicated
verify-replicated: servers
	@set -u; out=$(VERIFY_OUT); mkdir -p $$out; \
	(cd cmd/dlock && $(GO) build -o $$out/dlock .) || exit 1; \
	netns=; if [ "$$(uname)" = Linux ] && [ "$$(id -u)" = 0 ] && command -v ip >/dev/null; then netns=1; fi; \
	bad=; \
	v() { want=$$1 name=$$2; shift 2; echo "== $$name: $$*"; rc=0; \
		$$out/dlock verify --name $$name --runs $(RUNS) --duration $(DURATION) --seed 1 --out $$out/$$name "$$@" || rc=$$?; \
		case $$want/$$rc in any/[01]|pass/0|fail/1) ;; *) bad="$$bad $$name(exit $$rc, want $$want)";; esac; }; \
	v any  sentinel           --backend 'redis+sentinel://local'            --faults leader-kill,leader-pause --ttl 1s; \
	v any  sentinel-replicas1 --backend 'redis+sentinel://local?replicas=1' --faults leader-kill,leader-pause --ttl 1s; \
	v any  sentinel-replicas2 --backend 'redis+sentinel://local?replicas=2' --faults leader-kill,leader-pause --ttl 1s; \
	v any  cluster            --backend 'redis+cluster://local'             --faults leader-kill,leader-pause --ttl 1s; \
	v any  cluster-replicas1  --backend 'redis+cluster://local?replicas=1'  --faults leader-kill --ttl 1s; \
	v pass etcd3              --backend 'etcd://local?n=3'                  --faults leader-kill,leader-pause,proxy --ttl 2s; \
	v pass zk3                --backend 'zk://local?n=3'                    --faults leader-kill,leader-pause,proxy --ttl 2s; \
	v pass redlock5           --backend 'redlock://local?n=5'               --faults restart --ttl 1s; \
	v fail sentinel-forget    --backend 'redis+sentinel://local?weaken=forget' --faults leader-kill --ttl 1s; \
	v fail cluster-forget     --backend 'redis+cluster://local?weaken=forget'  --faults leader-pause --ttl 1s; \
	v fail redlock5-forget    --backend 'redlock://local?n=5&weaken=forget'    --faults restart --ttl 1s; \
	if [ -n "$$netns" ]; then \
		v any  sentinel-netns           --backend 'redis+sentinel://local'            --faults leader-partition --ttl 1s; \
		v any  sentinel-netns-replicas1 --backend 'redis+sentinel://local?replicas=1' --faults leader-partition --ttl 1s; \
		v pass etcd3-netns              --backend 'etcd://local?n=3'                  --faults leader-partition --ttl 2s; \
		v pass zk3-netns                --backend 'zk://local?n=3'                    --faults leader-partition --ttl 2s; \
		v fail etcd3-netns-forget       --backend 'etcd://local?n=3&weaken=forget'    --faults leader-partition --ttl 2s; \
		v fail zk3-netns-forget         --backend 'zk://local?n=3&weaken=forget'      --faults leader-partition --ttl 2s; \
	else \
		echo "== leader-partition rows skipped: they need Linux, root and the ip command"; \
		v fail etcd3-forget --backend 'etcd://local?n=3&weaken=forget' --faults leader-kill --ttl 2s; \
		v fail zk3-forget   --backend 'zk://local?n=3&weaken=forget'   --faults leader-kill --ttl 2s; \
	fi; \
	echo "reports: $$out/*/report.md"; \
	if [ -n "$$bad" ]; then echo "unexpected verdicts:$$bad"; exit 1; fi
