#!/usr/bin/env bash
# verify-replicated.sh — the campaign of docs/GUARANTEES.md, "Replicated
# deployments" (make verify-replicated runs it).
#
# Every deployment × fault, then the positive controls (?weaken=forget: a
# lock that releases every grant at once), which must FAIL. Each row is one
# `dlock verify` run into its own directory of VERIFY_OUT (report.md,
# histories and HTML timelines). Exits 1 when a positive control passes or
# an etcd, ZooKeeper or Redlock row does not pass; Sentinel and Cluster rows
# are reported, not asserted (a failover may lose a lock). leader-partition
# rows need Linux, root and the ip command and are skipped without them.
#
# Environment: RUNS (default 1) and DURATION (default 20s) per row (the
# published rows used RUNS=5 DURATION=60s), VERIFY_OUT (default
# /tmp/dlock-verify-replicated), GO (default go).
set -u
cd "$(dirname "$0")/.."
runs=${RUNS:-1}
duration=${DURATION:-20s}
out=${VERIFY_OUT:-/tmp/dlock-verify-replicated}
go=${GO:-go}

mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1 # absolute: the build runs in cmd/dlock
(cd cmd/dlock && $go build -o "$out/dlock" .) || exit 1
netns=
if [ "$(uname)" = Linux ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then netns=1; fi
bad=

# v WANT NAME ARGS...: runs `dlock verify` for the row NAME and records an
# exit status other than WANT's (pass: 0, fail: 1, any: 0 or 1) in bad.
v() {
	local want=$1 name=$2 rc=0
	shift 2
	echo "== $name: $*"
	"$out/dlock" verify --name "$name" --runs "$runs" --duration "$duration" --seed 1 --out "$out/$name" "$@" || rc=$?
	case $want/$rc in
	any/[01] | pass/0 | fail/1) ;;
	*) bad="$bad $name(exit $rc, want $want)" ;;
	esac
}

v any  sentinel           --backend 'redis+sentinel://local'            --faults leader-kill,leader-pause --ttl 1s
v any  sentinel-replicas1 --backend 'redis+sentinel://local?replicas=1' --faults leader-kill,leader-pause --ttl 1s
v any  sentinel-replicas2 --backend 'redis+sentinel://local?replicas=2' --faults leader-kill,leader-pause --ttl 1s
v any  cluster            --backend 'redis+cluster://local'             --faults leader-kill,leader-pause --ttl 1s
v any  cluster-replicas1  --backend 'redis+cluster://local?replicas=1'  --faults leader-kill --ttl 1s
v pass etcd3              --backend 'etcd://local?n=3'                  --faults leader-kill,leader-pause,proxy --ttl 2s
v pass zk3                --backend 'zk://local?n=3'                    --faults leader-kill,leader-pause,proxy --ttl 2s
v pass redlock5           --backend 'redlock://local?n=5'               --faults restart --ttl 1s
v fail sentinel-forget    --backend 'redis+sentinel://local?weaken=forget' --faults leader-kill --ttl 1s
v fail cluster-forget     --backend 'redis+cluster://local?weaken=forget'  --faults leader-pause --ttl 1s
v fail redlock5-forget    --backend 'redlock://local?n=5&weaken=forget'    --faults restart --ttl 1s
if [ -n "$netns" ]; then
	v any  sentinel-netns           --backend 'redis+sentinel://local'            --faults leader-partition --ttl 1s
	v any  sentinel-netns-replicas1 --backend 'redis+sentinel://local?replicas=1' --faults leader-partition --ttl 1s
	v pass etcd3-netns              --backend 'etcd://local?n=3'                  --faults leader-partition --ttl 2s
	v pass zk3-netns                --backend 'zk://local?n=3'                    --faults leader-partition --ttl 2s
	v fail etcd3-netns-forget       --backend 'etcd://local?n=3&weaken=forget'    --faults leader-partition --ttl 2s
	v fail zk3-netns-forget         --backend 'zk://local?n=3&weaken=forget'      --faults leader-partition --ttl 2s
else
	echo "== leader-partition rows skipped: they need Linux, root and the ip command"
	v fail etcd3-forget --backend 'etcd://local?n=3&weaken=forget' --faults leader-kill --ttl 2s
	v fail zk3-forget   --backend 'zk://local?n=3&weaken=forget'   --faults leader-kill --ttl 2s
fi
echo "reports: $out/*/report.md"
if [ -n "$bad" ]; then echo "unexpected verdicts:$bad"; exit 1; fi
