#!/usr/bin/env bash
# Build the Prometheus server for the e2e world (kvgate_e2e/prometheus.py runs it inside the
# world's network namespace: it scrapes the operator, the webhook, the engines and the routers
# found by kubernetes_sd and evaluates the chart's alert rules). Never committed: the binary
# lives outside the clone.
#
#   e2e/prometheus/build.sh               build if missing, print the binary's path
#   e2e/prometheus/build.sh --print-path  print where it is (or would be) and exit
#
# Source: the Go module proxy, github.com/prometheus/prometheus/cmd/prometheus at
# PROMETHEUS_VERSION (default v0.316.0 = Prometheus 3.16.0, the module and version promtool is
# built from: tests/chart/promtool/build.sh), built with the machine's Go (GOMODCACHE/GOCACHE at
# their defaults, so the modules promtool downloaded are reused). Built with the tags
# remove_all_sd,enable_kubernetes_sd: only Kubernetes service discovery (plus file and http,
# always in), which is all the world uses. No web UI assets (the builtinassets tag is off): the
# HTTP API (/api/v1/...) works, the UI pages do not.
# Built by e2e/gobuild/install.sh (shared with promtool and prometheus-adapter).
# Cache: ${KVGATE_PROMETHEUS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/prometheus}/<version>-<go>/prometheus.
# The first build takes minutes on 2 cores (`make prometheus`; `make deps` and `make e2e` run it).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
ROOT="${KVGATE_PROMETHEUS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/prometheus}"
ARGS=()
if [ "${1:-}" = "--print-path" ]; then ARGS=(--print-path); fi
exec "$HERE/../gobuild/install.sh" "${ARGS[@]}" "github.com/prometheus/prometheus@${VERSION}" \
  cmd/prometheus "$ROOT" remove_all_sd,enable_kubernetes_sd
