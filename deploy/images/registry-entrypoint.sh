#!/bin/bash
# Entry point of deploy/registry.Dockerfile: Apicurio Registry (a Quarkus application) from the jars
# the project fetches with Maven. Configured as the apicurio/apicurio-registry image is, by
# environment variables (APICURIO_STORAGE_KIND, APICURIO_DATASOURCE_URL, QUARKUS_HTTP_PORT, ...),
# which Quarkus reads itself.
set -euo pipefail
shopt -s nullglob
runner=(/opt/apicurio/app/*-runner.jar /opt/apicurio/app/quarkus-run.jar)
if [ ${#runner[@]} -eq 0 ]; then
  echo "registry-entrypoint: no launcher jar in /opt/apicurio/app" >&2; exit 1
fi
tmp=${TMPDIR:-/tmp}
# shellcheck disable=SC2086  # JAVA_OPTS holds several JVM options
exec java ${JAVA_OPTS:--Xmx512m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC} -XX:+ExitOnOutOfMemoryError \
  "-Djava.io.tmpdir=$tmp" "-Dvertx.cacheDirBase=$tmp/vertx" -Dquarkus.http.host=0.0.0.0 \
  -jar "${runner[0]}"
