#!/usr/bin/env bash
# `make image`: builds the daemon's image (deploy/Dockerfile) with podman on a machine without a
# Docker engine or a reachable registry.
#
#   scripts/image.sh                 -> localhost/cdc:local (also tagged cdc:local for compose)
#   BASE=docker.io/library/python:3.11-slim-bookworm scripts/image.sh    a registry base instead
#   IMAGE=localhost/cdc:0.1.0 scripts/image.sh
#
# The base is the cached local Debian image of scripts/base-image.sh unless BASE is given. The wheels
# of cdc and its dependencies are built on the host (.venv's pip, which reaches the package index)
# into build/wheels/ and installed offline in the image, because pip inside a build cannot.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/container-deps.sh
PY=${PYTHON:-.venv/bin/python}
IMAGE=${IMAGE:-localhost/cdc:local}
BASE=${BASE:-$(bash scripts/base-image.sh)}
podman=(podman --runtime runc --cgroup-manager cgroupfs)

# The wheels must match the image's Python (3.11 in bookworm and in python:3.11-slim).
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$pyver" != "3.11" ]; then
  echo "image: $PY is Python $pyver; the image runs 3.11, so its wheels must be built by a 3.11 (PYTHON=...)" >&2
  exit 1
fi

start=$(date +%s.%N)
rm -rf build/wheels
# Reproducible wheels (timestamps from the last commit), so an unchanged tree hits the build cache.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
"$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir build/wheels .
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
"${podman[@]}" build --format docker --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
  --ignorefile deploy/Dockerfile.dockerignore -f deploy/Dockerfile \
  --build-arg BASE="$BASE" --build-arg WHEELS=host-wheels --build-arg REVISION="$revision" \
  -t "$IMAGE" -t localhost/cdc:local . >&2
end=$(date +%s.%N)
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$IMAGE")
printf 'image: built %s from %s in %.1f s, %d MB\n' "$IMAGE" "$BASE" "$(echo "$end - $start" | bc)" "$((size / 1000000))" >&2
