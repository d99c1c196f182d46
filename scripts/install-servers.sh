#!/usr/bin/env bash
# install-servers.sh — make sure the servers internal/testserver starts are
# installed: redis-server (Debian package redis-server), etcd (etcd-server),
# ZooKeeper with java (zookeeper, which pulls in default-jre and
# libzookeeper-java) and PostgreSQL (postgresql; initdb and postgres in
# /usr/lib/postgresql/N/bin, setpriv from util-linux to run it as the user
# postgres when the tests run as root).
#
# Checks each one; if something is missing and we run as root, runs
# `apt-get update` once and `apt-get install -y --no-install-recommends` for
# the missing packages. If not root, prints the command and exits 1.
#
# Installing redis-server, etcd-server or postgresql may start system services
# (redis on 6379, etcd on 2379, postgres on 5432). They are left alone: tests
# never use those ports.
#
# Usage: scripts/install-servers.sh [--check]   (--check: only report, exit 1 if missing)
set -euo pipefail

check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

missing=()

have_redis() { command -v redis-server >/dev/null 2>&1; }
have_etcd() { command -v etcd >/dev/null 2>&1; }
# Same search order as internal/testserver: PATH, then Debian's layout.
have_postgres() {
  command -v postgres >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null
}
have_java() { command -v java >/dev/null 2>&1 || [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; }
# Same search order as internal/testserver: $ZOOKEEPER_HOME, Debian's jar,
# then the older /usr/share/zookeeper layout.
have_zookeeper_jars() {
  local d
  if [[ -n "${ZOOKEEPER_HOME:-}" ]]; then
    for d in "$ZOOKEEPER_HOME" "$ZOOKEEPER_HOME/lib"; do
      compgen -G "$d/zookeeper*.jar" >/dev/null && return 0
    done
  fi
  [[ -f /usr/share/java/zookeeper.jar ]] && return 0
  for d in /usr/share/zookeeper /usr/share/zookeeper/lib; do
    compgen -G "$d/zookeeper*.jar" >/dev/null && return 0
  done
  return 1
}

report() { # name ok-bool detail
  if [[ "$2" == true ]]; then
    printf '  %-12s ok       %s\n' "$1" "$3"
  else
    printf '  %-12s MISSING  %s\n' "$1" "$3"
  fi
}

echo "testserver prerequisites:"
if have_redis; then
  report redis-server true "$(redis-server --version 2>/dev/null | head -n1)"
else
  report redis-server false "package redis-server"
  missing+=(redis-server)
fi
if have_etcd; then
  report etcd true "$(etcd --version 2>/dev/null | head -n1)"
else
  report etcd false "package etcd-server"
  missing+=(etcd-server)
fi
zk_ok=true
if have_java; then
  report java true "$(java -version 2>&1 | head -n1)"
else
  report java false "package zookeeper (depends on default-jre)"
  zk_ok=false
fi
if have_zookeeper_jars; then
  report zookeeper true "jars found"
else
  report zookeeper false "package zookeeper"
  zk_ok=false
fi
if [[ "$zk_ok" == false ]]; then
  missing+=(zookeeper)
fi
if have_postgres; then
  report postgresql true "$({ command -v postgres || compgen -G '/usr/lib/postgresql/*/bin/postgres'; } | tail -n1)"
else
  report postgresql false "package postgresql"
  missing+=(postgresql)
fi

if ((${#missing[@]} == 0)); then
  echo "all present."
  exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ "$check_only" == true ]]; then
  echo "missing; install with: apt-get update && $cmd" >&2
  exit 1
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "missing packages and not running as root; run:" >&2
  echo "  sudo apt-get update && sudo $cmd" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get not found; install these packages with your package manager: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "+ apt-get update"
apt-get update
echo "+ $cmd"
# shellcheck disable=SC2086 # word splitting of the package list is intended
apt-get install -y --no-install-recommends ${missing[*]}

# Verify.
fail=false
have_redis || { echo "redis-server still missing" >&2; fail=true; }
have_etcd || { echo "etcd still missing" >&2; fail=true; }
{ have_java && have_zookeeper_jars; } || { echo "java or ZooKeeper jars still missing" >&2; fail=true; }
have_postgres || { echo "postgres still missing" >&2; fail=true; }
[[ "$fail" == false ]] || exit 1
echo "all present."
