#!/usr/bin/env bash
# `make spark-image`: builds the Spark jobs' image (deploy/spark.Dockerfile) with podman, like
# scripts/image.sh: the cached local Debian base unless BASE is given, the wheels of cdc[spark]
# (pyspark, delta-spark: whatever pyproject.toml pins) built on the host into build/spark-wheels/,
# and the Spark jars from the host's cache (`cdc_views.jars fetch`, Maven) into build/spark-cache/.
# Only the Java runtime and procps come from Debian's packages inside the build.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/container-deps.sh
PY=${PYTHON:-.venv/bin/python}
IMAGE=${IMAGE:-localhost/cdc-spark:local}
BASE=${BASE:-$(bash scripts/base-image.sh)}
podman=(podman --runtime runc --cgroup-manager cgroupfs)

start=$(date +%s.%N)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
rm -rf build/spark-wheels build/spark-cache
"$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir build/spark-wheels '.[spark]'
CDC_CACHE_DIR=build/spark-cache PYTHONPATH=spark "$PY" -m cdc_views.jars fetch >&2
"${podman[@]}" build --format docker --network host --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
  --ignorefile deploy/spark.Dockerfile.dockerignore -f deploy/spark.Dockerfile \
  --build-arg BASE="$BASE" --build-arg DEPS=host-deps -t "$IMAGE" . >&2
end=$(date +%s.%N)
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$IMAGE")
printf 'spark-image: built %s from %s in %.1f s, %d MB\n' "$IMAGE" "$BASE" "$(echo "$end - $start" | bc)" "$((size / 1000000))" >&2
