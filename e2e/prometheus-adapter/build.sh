#!/usr/bin/env bash
# Build prometheus-adapter for the e2e world (kvgate_e2e/prometheus_adapter.py runs it inside the
# world's network namespace: it serves custom.metrics.k8s.io from the world's Prometheus through
# the API server's aggregation layer, so the world's real HPA controller can scale on engine
# metrics). Never committed: the binary lives outside the clone.
#
#   e2e/prometheus-adapter/build.sh               build if missing, print the binary's path
#   e2e/prometheus-adapter/build.sh --print-path  print where it is (or would be) and exit
#
# Source: the Go module proxy, sigs.k8s.io/prometheus-adapter/cmd/adapter at
# PROMETHEUS_ADAPTER_VERSION (default v0.12.0), built with its own go.mod and go.sum by
# e2e/gobuild/install.sh (`go install ...@v0.12.0` fails here: proxy.golang.org refuses the
# module's version list, which go install reads for deprecations).
# Cache: ${KVGATE_PROMETHEUS_ADAPTER_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/prometheus-adapter}/<version>-<go>/adapter.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="${PROMETHEUS_ADAPTER_VERSION:-v0.12.0}"
ROOT="${KVGATE_PROMETHEUS_ADAPTER_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/prometheus-adapter}"
ARGS=()
if [ "${1:-}" = "--print-path" ]; then ARGS=(--print-path); fi
# It has no --version (and --help exits 2): its presence is the check.
BUILT_CHECK_ARG="" exec "$HERE/../gobuild/install.sh" "${ARGS[@]}" \
  "sigs.k8s.io/prometheus-adapter@${VERSION}" cmd/adapter "$ROOT"
