#!/bin/sh
exec java -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties -cp "/opt/kafka/libs/*" \
    org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
