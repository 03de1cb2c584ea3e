#!/usr/bin/env bash
# Toxiproxy's server, the fault-injecting TCP proxy of the network-stall test
# (tests/integration/test_network_stall.py): built once from its Go module into the per-user cache and
# printed as a path. Debian has no package of it and PyPI only clients, hence the Go build
# (about a minute, once). Exits non-zero, saying why, when it cannot be had: the test then fails.
set -euo pipefail
VERSION=v2.12.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kbroker/toxiproxy-$VERSION"
bin="$dir/server"
if [ ! -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    for candidate in /usr/local/go/bin/go /usr/lib/go/bin/go; do
      [ -x "$candidate" ] && PATH="$(dirname "$candidate"):$PATH" && break
    done
  fi
  if ! command -v go >/dev/null 2>&1; then
    echo "the network-stall test needs Toxiproxy $VERSION, built with Go: install Go (e.g. apt-get install golang-go), then run make again" >&2
    exit 1
  fi
  echo "building Toxiproxy $VERSION into $dir (once)" >&2
  mkdir -p "$dir"
  GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION" >&2
fi
echo "$bin"
