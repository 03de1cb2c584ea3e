#!/usr/bin/env bash
# Java 17+ and Maven for the embedded Kafka broker; for the tests also Go to build the
# network-stall test's Toxiproxy (scripts/toxiproxy.sh), Chromium for the dashboard's browser
# test (Playwright drives it) and Prometheus for the metrics test (it scrapes a worker).
# `prereqs.sh demo`: Java and Maven only, what `make demo` needs. `prereqs.sh long`: also podman,
# podman-compose, runc and debootstrap, which `make test-long`'s compose run needs. Installs
# Debian's packages when missing and this user may (root); otherwise says what to install.
set -euo pipefail
demo=false
long=false
[ "${1:-}" = demo ] && demo=true
[ "${1:-}" = long ] && long=true
need=()
if ! command -v java >/dev/null 2>&1 || \
   ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then
  need+=(openjdk-17-jre-headless)
fi
command -v mvn >/dev/null 2>&1 || need+=(maven)
lean=()
if ! $demo; then
  { command -v go || [ -x /usr/local/go/bin/go ]; } >/dev/null 2>&1 || need+=(golang-go)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)  # the dashboard's browser test (Playwright)
  # The server alone: its recommended node exporter and friends are not needed (nor started).
  command -v prometheus >/dev/null 2>&1 || lean+=(prometheus)  # the metrics test's scraper
fi
if $long; then  # tests/integration/test_compose_stack.py
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v podman-compose >/dev/null 2>&1 || need+=(podman-compose)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
fi
[ ${#need[@]} -eq 0 ] && [ ${#lean[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} ${lean[*]} with apt-get" >&2
  apt-get update -qq
  [ ${#need[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  [ ${#lean[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
else
  echo "kbroker needs ${need[*]} ${lean[*]}: install Java 17+, Maven (and Go, Chromium and Prometheus for the tests; podman, podman-compose, runc and debootstrap for test-long), then run make again" >&2
  exit 1
fi
