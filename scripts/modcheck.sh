#!/usr/bin/env bash
# modcheck: proves that every module of the workspace (go.work) can be used
# as a published module, offline, in about a minute.
#
#  1. Checks the module files: no module requires another module of this
#     repository through a replace directive, all of them require each other
#     at one version V, and go.work maps V of every module to its directory.
#  2. Copies the working tree (tracked and untracked, not ignored files) into
#     a temporary git repository, commits it and tags it as a release of V:
#     vV for the root module, DIR/vV for the module in DIR (docs/RELEASING.md).
#  3. Builds a file-based module proxy from that repository with the go
#     command's own VCS code (git's url.insteadOf points
#     https://github.com/dlock-go/dlock at the temporary repository), so the
#     module zips and their subdirectory tags are exactly what a proxy would
#     serve after the tags are pushed.
#  4. In a fresh module outside the repository, with that proxy and the
#     local module cache as file proxies in front of GOPROXY (which serves
#     only the third-party versions the local cache lacks: a command's own
#     go.mod may select older ones than the workspace build downloaded), a
#     module cache of its own (third-party modules linked from the local
#     one) and no checksum database: `go get` of every library module,
#     `go install github.com/dlock-go/dlock/cmd/dlock@latest` (the README's
#     command) and of the other commands at V (resolved, not built), then
#     builds and runs a program that takes a lock on memlock and imports every
#     non-internal package of every library module.
#
# Usage: scripts/modcheck.sh            the check above
#        scripts/modcheck.sh tidy [DIR...]
#            runs `go mod tidy` in each module (or in DIR...) with steps 1-3's
#            proxy in front of GOPROXY, so that a module can be tidied before
#            the versions it requires of this repository are published; the
#            go.sum lines of this repository's modules are then removed (their
#            hashes are those of the working tree, not of the release).
# The third-party modules must be in the local module cache: any build or
# test of the workspace puts them there (make test runs this last).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
mode=${1:-check}
[ $# -gt 0 ] && shift
case "$mode" in check | tidy) ;; *) echo "usage: $0 [tidy [DIR...]]" >&2; exit 2 ;; esac
upstream=$($GO env GOPROXY)
repo_path=github.com/dlock-go/dlock
start=$SECONDS

die() { echo "modcheck: $*" >&2; exit 1; }
step() { echo "modcheck: [$((SECONDS - start))s] $*"; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-modcheck.XXXXXX")
cleanup() {
	find "$tmp" -type l -delete 2>/dev/null || true # the links into the local module cache first
	chmod -R u+w "$tmp" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

cd "$root"
modcache=$($GO env GOMODCACHE)
[ -d "$modcache/cache/download" ] || die "no local module cache at $modcache: build the workspace first"

# sharedcache DIR makes DIR a module cache of its own that reaches the
# local one's third-party modules through symbolic links (nothing is
# extracted again) and has none of this repository's modules: those the go
# command fetches land in DIR only, never in the local cache, which would
# keep serving that content for the version after the tree changed.
sharedcache() {
	local dst=$1 e
	mkdir -p "$dst/github.com" "$dst/cache/download/github.com"
	for e in "$modcache"/* "$modcache"/github.com/* "$modcache"/cache/download/* "$modcache"/cache/download/github.com/*; do
		[ -e "$e" ] || continue
		case "${e#"$modcache"/}" in
		cache | github.com | cache/download | cache/download/github.com | github.com/dlock-go | cache/download/github.com/dlock-go) ;;
		*) ln -s "$e" "$dst/${e#"$modcache"/}" ;;
		esac
	done
}

# --- 1. the module files ---------------------------------------------------

# dirs[i] is a module directory relative to the root ("." for the root),
# paths[i] its module path.
dirs=() paths=()
while IFS= read -r d; do
	d=${d#./}
	[ -z "$d" ] && d=.
	[ -f "$d/go.mod" ] || die "go.work uses $d, which has no go.mod"
	p=$(awk '$1 == "module" { print $2; exit }' "$d/go.mod")
	case "$p" in
	"$repo_path") [ "$d" = . ] || die "$d/go.mod declares the root module path" ;;
	"$repo_path/$d") ;;
	*) die "$d/go.mod declares module $p, want $repo_path/$d" ;;
	esac
	dirs+=("$d") paths+=("$p")
done < <($GO work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
[ "${dirs[0]}" = . ] || die "go.work does not use the root module first"

is_own() { local p; for p in "${paths[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

version=
for i in "${!dirs[@]}"; do
	d=${dirs[$i]}
	json=$($GO mod edit -json "$d/go.mod")
	# Replace directives of go.mod: none may name a module of this repository.
	while IFS= read -r r; do
		is_own "$r" && die "$d/go.mod replaces $r: drop it (go.work maps the local modules; run scripts/setversion.sh)"
	done < <(printf '%s' "$json" | awk '/"Old"/ { on = 1 } on && /"Path"/ { gsub(/[",]/, "", $2); print $2; on = 0 }')
	# Requires of this repository's modules: all at one version.
	while read -r p v; do
		is_own "$p" || continue
		[ -z "$version" ] && version=$v
		[ "$v" = "$version" ] || die "$d/go.mod requires $p $v, other modules require $version: run scripts/setversion.sh"
	done < <(printf '%s' "$json" |
		awk '/"Require"/ { on = 1 } /"Exclude"|"Replace"|"Retract"|"Tool"/ { on = 0 }
		     on && /"Path"/ { gsub(/[",]/, "", $2); p = $2 }
		     on && /"Version"/ { gsub(/[",]/, "", $2); print p, $2 }')
done
[ -n "$version" ] || die "no module requires another module of this repository"
case "$version" in v[0-9]*.[0-9]*.[0-9]*) ;; *) die "the modules require each other at $version, not a release version" ;; esac
wjson=$($GO work edit -json)
for i in "${!dirs[@]}"; do
	d=${dirs[$i]} p=${paths[$i]}
	printf '%s' "$wjson" | tr -d '\n\t ' | grep -q "\"Old\":{\"Path\":\"$p\",\"Version\":\"$version\"},\"New\":{\"Path\":\"\(\./\)\?$d\"" ||
		die "go.work does not replace $p $version with ./$d: run scripts/setversion.sh $version"
done
step "${#dirs[@]} modules, released together as $version"

# Commands (a main package at the module root) and library packages to import.
libs=() cmds=() imports=()
for i in "${!dirs[@]}"; do
	d=${dirs[$i]} p=${paths[$i]}
	pkgs=$(cd "$root/$d" && GOPROXY=off $GO list -find -f '{{.Name}} {{.ImportPath}}' ./...)
	if [ "$(printf '%s\n' "$pkgs" | awk -v p="$p" '$2 == p { print $1 }')" = main ]; then
		cmds+=("$p")
		continue
	fi
	libs+=("$p")
	while read -r name ip; do
		case "$ip" in */internal/* | */internal) continue ;; esac
		[ "$name" = main ] && continue
		imports+=("$ip")
	done <<<"$pkgs"
done


# --- 2. a tagged copy of the working tree -------------------------------------

export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL="$tmp/gitconfig"
export GIT_AUTHOR_NAME=modcheck GIT_AUTHOR_EMAIL=modcheck@localhost
export GIT_COMMITTER_NAME=modcheck GIT_COMMITTER_EMAIL=modcheck@localhost
: >"$GIT_CONFIG_GLOBAL"
src="$tmp/src"
mkdir -p "$src"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
	git -C "$root" ls-files -z -co --exclude-standard |
		while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
		tar --null -T - -cf - | tar -xf - -C "$src"
else
	tar --exclude=.git -cf - . | tar -xf - -C "$src"
fi
git -C "$src" init -q
git -C "$src" add -A
git -C "$src" commit -q -m "release $version"
for d in "${dirs[@]}"; do
	if [ "$d" = . ]; then git -C "$src" tag "$version"; else git -C "$src" tag "$d/$version"; fi
done
step "tagged a copy of the working tree: $(git -C "$src" tag | tr '\n' ' ')"

# --- 3. the file proxy ------------------------------------------------------------

git config --file "$GIT_CONFIG_GLOBAL" "url.$src.insteadOf" "https://$repo_path"
proxy="$tmp/proxy"
mkdir -p "$tmp/empty"
(cd "$tmp/empty" && env GOMODCACHE="$proxy" GOPROXY=direct GOSUMDB=off GONOSUMDB="$repo_path" \
	GOWORK=off GOFLAGS=-modcacherw GOTOOLCHAIN=local \
	$GO mod download "${paths[@]/%/@$version}") || die "building the proxy from the tagged copy failed"
proxy="$proxy/cache/download"
step "file proxy at $proxy"

if [ "$mode" = tidy ]; then
	[ $# -gt 0 ] || set -- "${dirs[@]}"
	for d in "$@"; do
		# A temporary module cache: the repository's modules must never
		# enter the real one (it would keep serving this content for the
		# version after the tree changed, or after the release).
		[ -d "$tmp/tidycache" ] || sharedcache "$tmp/tidycache"
		(cd "$root/$d" && env GOWORK=off GOMODCACHE="$tmp/tidycache" GOFLAGS="-mod=mod -modcacherw" \
			GOPROXY="file://$proxy,file://$modcache/cache/download,$upstream" GONOSUMDB="$repo_path" \
			GOTOOLCHAIN=local $GO mod tidy) || die "go mod tidy in $d failed"
		if [ -f "$root/$d/go.sum" ]; then
			grep -v "^$repo_path[/ ]" "$root/$d/go.sum" >"$tmp/go.sum" || true
			cat "$tmp/go.sum" >"$root/$d/go.sum"
		fi
		step "go mod tidy in $d"
	done
	exit 0
fi

# --- 4. a consumer outside the repository --------------------------------------

sharedcache "$tmp/modcache"
export GOMODCACHE="$tmp/modcache" GOBIN="$tmp/bin"
export GOPROXY="file://$proxy,file://$modcache/cache/download,$upstream"
export GOSUMDB=off GONOSUMDB="$repo_path" GONOSUMCHECK=1 GOPRIVATE= GONOPROXY= GOINSECURE=
export GOWORK=off GOTOOLCHAIN=local GOFLAGS="-mod=mod -modcacherw -trimpath"
consumer="$tmp/consumer"
mkdir -p "$consumer"
cd "$consumer"
$GO mod init example.com/consumer >/dev/null 2>&1

$GO get "${libs[@]/%/@$version}" || die "go get of the library modules failed"
step "go get ${libs[*]/%/@$version}"

for p in "${cmds[@]}"; do
	if [ "$p" = "$repo_path/cmd/dlock" ]; then
		$GO install "$p@latest" || die "go install $p@latest failed"
		"$GOBIN/dlock" --help >/dev/null || die "the installed dlock does not run"
		step "go install $p@latest"
	else
		# Resolved and loaded as go install would, not compiled: the
		# workspace build compiles the same sources.
		$GO install -n "$p@$version" 2>/dev/null || die "go install $p@$version failed"
		step "go install -n $p@$version"
	fi
done

{
	cat <<'EOF'
// Command consumer takes a lock through the published modules.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
EOF
	for ip in "${imports[@]}"; do
		case "$ip" in "$repo_path" | "$repo_path/memlock") continue ;; esac
		printf '\t_ "%s"\n' "$ip"
	done
	cat <<'EOF'
)

func main() {
	ctx := context.Background()
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Second))
	defer c.Close()
	l, err := c.Acquire(ctx, "modcheck")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := c.TryAcquire(ctx, "modcheck"); !errors.Is(err, dlock.ErrNotAcquired) {
		fmt.Fprintf(os.Stderr, "second TryAcquire: got %v, want ErrNotAcquired\n", err)
		os.Exit(1)
	}
	fmt.Println("locked, fence", l.Fence())
	if err := l.Release(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
EOF
} >main.go
$GO build -o consumer . || die "the consumer program does not build against the published modules"
out=$(./consumer) || die "the consumer program failed"
[ "$out" = "locked, fence 1" ] || die "the consumer program printed $out, want \"locked, fence 1\""
step "built and ran a program importing ${#imports[@]} packages: $out"
echo "modcheck: ok (${#dirs[@]} modules at $version, $((SECONDS - start))s)"
