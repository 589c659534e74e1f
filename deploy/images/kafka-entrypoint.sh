#!/bin/bash
# Entry point of deploy/kafka.Dockerfile: a single KRaft broker+controller configured like the
# apache/kafka image, from KAFKA_* environment variables (KAFKA_NODE_ID=1 -> node.id=1; a double
# underscore stands for one underscore, a triple one for a dash), so deploy/docker-compose.yml works
# with either image. CLUSTER_ID formats the log directory on first start.
set -euo pipefail
conf=${KAFKA_CONFIG_DIR:-/tmp/kafka-config}
mkdir -p "$conf"
props="$conf/server.properties"
: > "$props"
while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_JVM_OPTS|KAFKA_CONFIG_DIR) continue ;;
    KAFKA_*) ;;
    *) continue ;;
  esac
  key=${name#KAFKA_}
  key=$(printf '%s' "$key" | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g' | tr '[:upper:]' '[:lower:]')
  printf '%s=%s\n' "$key" "$value" >> "$props"
done < <(env)
cat > "$conf/log4j2.properties" <<'LOG'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.console.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
LOG
java=(java "-Dlog4j2.configurationFile=$conf/log4j2.properties" -Djava.awt.headless=true -cp '/opt/kafka/libs/*')
logdir=$(sed -n 's/^log\.dirs=//p' "$props" | cut -d, -f1)
if [ -z "$logdir" ]; then
  echo "kafka-entrypoint: KAFKA_LOG_DIRS is not set" >&2; exit 1
fi
if [ ! -e "$logdir/meta.properties" ]; then
  if [ -z "${CLUSTER_ID:-}" ]; then
    echo "kafka-entrypoint: CLUSTER_ID is not set and $logdir is not formatted" >&2; exit 1
  fi
  "${java[@]}" -Xmx256m kafka.tools.StorageTool format --cluster-id="$CLUSTER_ID" -c "$props"
fi
# shellcheck disable=SC2086  # KAFKA_HEAP_OPTS holds several JVM options
exec "${java[@]}" ${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m} -XX:+ExitOnOutOfMemoryError kafka.Kafka "$props"
