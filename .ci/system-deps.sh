#!/usr/bin/env bash
# Installs the Debian packages the project needs, only when they are missing (idempotent, quiet).
set -euo pipefail
need=()
[ -e /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
[ -e /usr/share/java/mariadb-java-client.jar ] || need+=(libmariadb-java)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the Sentinel and Cluster tests start their own servers (tests/redis_topologies.py)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "system-deps: missing ${need[*]}; run as root or install them with apt-get" >&2
    exit 1
  fi
  echo "system-deps: installing ${need[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
