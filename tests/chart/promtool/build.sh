#!/usr/bin/env bash
# Build Prometheus' promtool (the real rule parser and rule-test runner) into a cache folder, for
# tests/chart/test_chart_promtool.py. Never committed: the binary lives outside the clone.
#
#   tests/chart/promtool/build.sh               build if missing, print the binary's path
#   tests/chart/promtool/build.sh --print-path  print where it is (or would be) and exit
#
# Source: the Go module proxy (github.com/prometheus/prometheus/cmd/promtool at
# PROMETHEUS_VERSION, default v0.316.0 = Prometheus 3.16.0), built with the machine's Go
# (GOMODCACHE/GOCACHE at their defaults, so modules and packages persist across runs).
# Built by e2e/gobuild/install.sh (shared with the e2e world's prometheus and prometheus-adapter).
# Cache: ${KVGATE_PROMTOOL_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/promtool}/<version>-<go>/promtool.
# The build takes minutes on 2 cores: run it under the e2e lock on a shared machine
# (`make promtool` does).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
ROOT="${KVGATE_PROMTOOL_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/promtool}"
ARGS=()
if [ "${1:-}" = "--print-path" ]; then ARGS=(--print-path); fi
exec "$HERE/../../../e2e/gobuild/install.sh" "${ARGS[@]}" \
  "github.com/prometheus/prometheus@${VERSION}" cmd/promtool "$ROOT"
