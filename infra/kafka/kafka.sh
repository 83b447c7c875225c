#!/usr/bin/env bash
# Start/stop the local Apache Kafka broker: a thin wrapper over `rollstream kafka`.
#   infra/kafka/kafka.sh up [--brokers 3]     start (first run fetches the jars with Maven)
#   infra/kafka/kafka.sh status [--brokers 3]
#   infra/kafka/kafka.sh down [--brokers 3] [--wipe]
# The broker is Apache Kafka (KRaft, combined broker+controller) from Maven Central
# (pom.xml here), configured from server.properties.template and logging with log4j2.xml;
# state, jars and logs live under .rollstream/kafka/.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/rollstream kafka "$@"
