#!/usr/bin/env bash
# setversion: makes every module of the workspace require the other modules
# of this repository at VERSION, with no replace directive, and makes go.work
# map VERSION of each module to its directory (so that the workspace builds
# before VERSION is published). docs/RELEASING.md says when to run it.
#
# Usage: scripts/setversion.sh vX.Y.Z
set -euo pipefail
version=${1:-}
case "$version" in
v[0-9]*.[0-9]*.[0-9]*) ;;
*) echo "usage: $0 vX.Y.Z" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
GO=${GO:-go}
repo_path=github.com/dlock-go/dlock

dirs=() paths=()
while IFS= read -r d; do
	d=${d#./}
	[ -z "$d" ] && d=.
	dirs+=("$d") paths+=("$(awk '$1 == "module" { print $2; exit }' "$d/go.mod")")
done < <($GO work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')

own() { local p; for p in "${paths[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

# "Old" path and version of each replace directive in JSON from go mod/work edit -json.
replaced() {
	awk '/"Old"/ { on = 1; v = ""; next }
	     on && /"Path"/ { gsub(/[",]/, "", $2); p = $2 }
	     on && /"Version"/ { gsub(/[",]/, "", $2); v = $2 }
	     on && /}/ { print p, v; on = 0 }'
}

for i in "${!dirs[@]}"; do
	mod="${dirs[$i]}/go.mod"
	json=$($GO mod edit -json "$mod")
	while read -r p v; do
		own "$p" && $GO mod edit -dropreplace="$p${v:+@$v}" "$mod"
	done < <(printf '%s\n' "$json" | replaced)
	while read -r p; do
		own "$p" && [ "$p" != "${paths[$i]}" ] && $GO mod edit -require="$p@$version" "$mod"
	done < <(printf '%s\n' "$json" | awk '/"Require"/ { on = 1 } /"Exclude"|"Replace"|"Retract"|"Tool"/ { on = 0 }
		on && /"Path"/ { gsub(/[",]/, "", $2); print $2 }')
done

while read -r p v; do
	own "$p" && $GO work edit -dropreplace="$p${v:+@$v}"
done < <($GO work edit -json | replaced)
for i in "${!dirs[@]}"; do
	d=${dirs[$i]}
	[ "$d" = . ] || d=./$d
	$GO work edit -replace="${paths[$i]}@$version=$d"
done
echo "setversion: ${#dirs[@]} modules require each other at $version; go.work maps $version to the local directories"
