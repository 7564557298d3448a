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
# Cache: ${KVGATE_PROMTOOL_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/promtool}/<version>-<go>/promtool.
# The build takes minutes on 2 cores: run it under the e2e lock on a shared machine
# (`make promtool` does).
set -euo pipefail

VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
ROOT="${KVGATE_PROMTOOL_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/promtool}"
GO_VERSION="$(go env GOVERSION)"
DIR="$ROOT/${VERSION}-${GO_VERSION}"
BIN="$DIR/promtool"

if [ "${1:-}" = "--print-path" ]; then echo "$BIN"; exit 0; fi
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then echo "$BIN"; exit 0; fi

mkdir -p "$DIR"
started=$(date +%s)
# -trimpath and no VCS stamping: the same inputs give the same binary.
CGO_ENABLED=0 GOBIN="$DIR" GOFLAGS="-trimpath -buildvcs=false" GO111MODULE=on \
  go install -p "${GO_BUILD_PARALLEL:-2}" "github.com/prometheus/prometheus/cmd/promtool@${VERSION}" \
  >"$DIR/build.log" 2>&1 || { tail -20 "$DIR/build.log" >&2; exit 1; }
echo "built promtool ${VERSION} with ${GO_VERSION} in $(( $(date +%s) - started )) s" >>"$DIR/build.log"
"$BIN" --version >/dev/null
echo "$BIN"
