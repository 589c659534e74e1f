#!/usr/bin/env bash
# The quickstart's images built with podman (no Docker engine or registry needed), and the stack run
# as one pod with `podman kube play deploy/podman/quickstart.yaml`.
#
#   scripts/quickstart.sh images   build localhost/cdc-postgres|cdc-kafka|cdc-registry:local and the
#                                  daemon's image (scripts/image.sh); Kafka's and the registry's jars
#                                  are the ones `cdc dev up` fetches with Maven, copied to build/quickstart/
#   scripts/quickstart.sh jars     only copy those jars (what `docker compose build` needs first)
#   scripts/quickstart.sh up       images, then `podman kube play` (passwords from the environment:
#                                  POSTGRES_PASSWORD, CDC_DB_PASSWORD, REGISTRY_DB_PASSWORD)
#   scripts/quickstart.sh spark [ARGS]
#                                  a Spark job in the running pod (the Spark image, built by
#                                  scripts/spark-image.sh when missing): by default the warehouse
#                                  rebuild into the pod's warehouse volume; ARGS replace the job's
#                                  spark-submit arguments. CDC_DB_PASSWORD: the jobs read column types
#                                  from the database as the connector's role. The compose file's
#                                  `--profile spark run --rm spark`.
#   scripts/quickstart.sh down     `podman kube down`
#
# BASE=... builds from a registry base instead of the cached local Debian one (scripts/base-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
podman=(podman --runtime runc --cgroup-manager cgroupfs)
manifest=deploy/podman/quickstart.yaml

jars() {
  mkdir -p build/quickstart
  local kafka_libs registry_app
  kafka_libs=$("$PY" -c 'import structlog; from cdc.dev import kafka; print(kafka.jars(structlog.get_logger()))')
  registry_app=$("$PY" -c 'import structlog; from cdc.dev import registry; print(registry.distribution(structlog.get_logger()).parent)')
  rm -rf build/quickstart/kafka build/quickstart/registry
  mkdir -p build/quickstart/kafka build/quickstart/registry
  # Hard links where the cache is on the same file system: no copy of ~160 MB on every build.
  cp -rl "$kafka_libs" build/quickstart/kafka/libs 2>/dev/null || cp -r "$kafka_libs" build/quickstart/kafka/libs
  cp -rl "$registry_app" build/quickstart/registry/app 2>/dev/null || cp -r "$registry_app" build/quickstart/registry/app
}

build() {  # build NAME
  "${podman[@]}" build --format docker --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
    --ignorefile "deploy/$1.Dockerfile.dockerignore" -f "deploy/$1.Dockerfile" \
    --build-arg BASE="$BASE" -t "localhost/cdc-$1:local" . >&2
}

images() {
  bash scripts/container-deps.sh
  BASE=${BASE:-$(bash scripts/base-image.sh)}
  jars
  local name
  for name in postgres kafka registry; do build "$name"; done
  BASE="$BASE" bash scripts/image.sh
}

pause_deps() {
  # A pod's infra container runs catatonit, which Debian packages apart from podman.
  if ! command -v catatonit >/dev/null 2>&1 && [ ! -x /usr/libexec/podman/catatonit ]; then
    echo "quickstart: installing catatonit (the pod's pause process)" >&2
    local sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends catatonit >&2 \
      || { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends catatonit >&2; }
  fi
}

play() {  # kube play the pod; MANIFEST=... plays another copy of it (the tests drop its host ports)
  # The passwords reach the pod as a ConfigMap file given to --configmap: a private temporary file,
  # removed as soon as the pod has its environment. Never written into the repository.
  pause_deps
  local cm
  cm=$(mktemp)
  trap 'rm -f "$cm"' RETURN
  chmod 600 "$cm"
  printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cdc-quickstart-passwords\ndata:\n' > "$cm"
  local name
  for name in POSTGRES_PASSWORD CDC_DB_PASSWORD REGISTRY_DB_PASSWORD; do
    printf '  %s: %s\n' "$name" "$("$PY" -c 'import json, os, sys; print(json.dumps(os.environ[sys.argv[1]]))' "$name")" >> "$cm"
  done
  "${podman[@]}" kube play --replace --configmap "$cm" "${MANIFEST:-$manifest}" >&2
}

spark() {  # a job in the pod's network namespace, where postgres and kafka are host aliases of 127.0.0.1
  : "${CDC_DB_PASSWORD:?set CDC_DB_PASSWORD (the password of the connector role: the jobs read the catalog)}"
  local pod=${POD:-cdc-quickstart} image=localhost/cdc-spark:local
  "${podman[@]}" image exists "$image" || bash scripts/spark-image.sh
  "${podman[@]}" volume exists "$pod-warehouse" || "${podman[@]}" volume create "$pod-warehouse" >/dev/null
  if [ $# -eq 0 ]; then
    set -- --master 'local[2]' /opt/cdc/spark/warehouse.py --config /etc/cdc/cdc.yaml --warehouse /data/warehouse
  fi
  # The password comes from this process's environment (-e NAME without a value), never a command line.
  CDC_SOURCE__PASSWORD=$CDC_DB_PASSWORD "${podman[@]}" run --rm --pod "$pod" --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
    -e CDC_SOURCE__PASSWORD -e CDC_SPARK_LOG_LEVEL=WARN \
    -v "$PWD/deploy/cdc.yaml:/etc/cdc/cdc.yaml:ro" -v "$pod-warehouse:/data/warehouse" \
    ${ENTRYPOINT:+--entrypoint "$ENTRYPOINT"} "$image" "$@"
}

case "${1:-}" in
  jars) jars ;;
  images) images ;;
  up)
    images
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" "${CDC_DB_PASSWORD:?set CDC_DB_PASSWORD}"
    : "${REGISTRY_DB_PASSWORD:?set REGISTRY_DB_PASSWORD}"
    play
    ;;
  play) play ;;
  spark) shift; spark "$@" ;;
  down) "${podman[@]}" kube down "${MANIFEST:-$manifest}" >&2 ;;
  *) echo "usage: scripts/quickstart.sh images|jars|up|play|spark|down" >&2; exit 2 ;;
esac
