#!/usr/bin/env bash
# Fetches Debian's `prometheus` package (which carries `prometheus` and `promtool`) into the project's
# cache without installing anything system-wide: `apt-get download` plus `dpkg-deb -x`, as non-root.
# Prints the directory holding the two binaries. Idempotent: a second run only prints it.
#   $CDC_CACHE_DIR/prometheus/<version>/usr/bin/{prometheus,promtool}   (default ~/.cache/cdc)
# Debian/Ubuntu only (the project's services come from the same registries: apt, Maven Central, PyPI).
set -euo pipefail

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  # Not Debian/Ubuntu: the tests that need promtool skip themselves; nothing is printed on stdout.
  echo "prometheus.sh: apt-get and dpkg-deb are needed to fetch Debian's prometheus package; skipped" >&2
  exit 0
fi
cache=${CDC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cdc}/prometheus
mkdir -p "$cache"
version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq >&2; elif command -v sudo >/dev/null 2>&1; then sudo apt-get update -qq >&2; fi
  version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
fi
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  echo "prometheus.sh: no 'prometheus' package in the apt sources (apt-cache policy prometheus)" >&2
  exit 1
fi
dest="$cache/${version//[:+~]/_}"
if [ -x "$dest/usr/bin/promtool" ] && [ -x "$dest/usr/bin/prometheus" ]; then
  echo "$dest/usr/bin"
  exit 0
fi
work=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q "prometheus=$version" >&2)
mkdir -p "$work/root"
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
"$work/root/usr/bin/promtool" --version >/dev/null
rm -rf "$dest"
mv "$work/root" "$dest"
echo "$dest/usr/bin"
