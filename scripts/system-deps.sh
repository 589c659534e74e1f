#!/usr/bin/env bash
# Installs the operating-system packages the local services need, when they are missing:
# PostgreSQL 15 server binaries, a Java runtime and Maven (for Kafka's jars). Debian/Ubuntu only.
set -euo pipefail

need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "system-deps: installing ${need[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "system-deps: ${need[*]} missing and not root: install them with apt-get" >&2; exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
# The Debian package starts a cluster of its own; the project runs its own, so stop that one.
if [[ " ${need[*]} " == *" postgresql-15 "* ]] && command -v pg_ctlcluster >/dev/null 2>&1; then
  $SUDO pg_ctlcluster 15 main stop 2>/dev/null || true
fi
