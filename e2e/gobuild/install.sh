#!/usr/bin/env bash
# Build one Go program from the Go module proxy into a cache folder outside the clone (never
# committed), and print the binary's path. Shared by tests/chart/promtool/build.sh,
# e2e/prometheus/build.sh and e2e/prometheus-adapter/build.sh.
#
#   e2e/gobuild/install.sh [--print-path] <module>@<version> <package dir> <cache root> [tags]
#
# The binary is <cache root>/<version>-<go version>/<last element of package dir>; --print-path
# prints where it is (or would be) and exits. The module is fetched with `go mod download` and
# built inside its own (read-only) source dir in GOMODCACHE, with its go.mod and go.sum as
# released: what `go install <module>/<package>@<version>` builds, but that first reads the
# proxy's version list for deprecations, which proxy.golang.org refuses for some modules
# (sigs.k8s.io/prometheus-adapter, sigs.k8s.io/lws); a go.work in the module (Prometheus ships one
# naming folders its zip leaves out) is ignored (GOWORK=off), as go install ignores it. The
# machine's Go, GOMODCACHE/GOCACHE at their defaults (modules and compiled packages persist
# across runs and builds), CGO off, -trimpath and no VCS stamping (the same inputs give the same
# binary), GO_BUILD_PARALLEL (default 2) packages at once; built beside its place and renamed
# into it (an interrupted build leaves no binary). A binary is taken as built once it answers
# --version with exit status 0 (BUILT_CHECK_ARG names another argument; empty: the binary's
# presence is enough, for a program with no such flag).
set -euo pipefail

PRINT_ONLY=0
if [ "${1:-}" = "--print-path" ]; then PRINT_ONLY=1; shift; fi
if [ $# -lt 3 ]; then
  echo "usage: $0 [--print-path] <module>@<version> <package dir> <cache root> [tags]" >&2
  exit 2
fi
TARGET="$1" PACKAGE="$2" ROOT="$3" TAGS="${4:-}"
VERSION="${TARGET##*@}"
NAME="$(basename "$PACKAGE")"
CHECK="${BUILT_CHECK_ARG---version}"
GO_VERSION="$(go env GOVERSION)"
DIR="$ROOT/${VERSION}-${GO_VERSION}"
BIN="$DIR/$NAME"

if [ "$PRINT_ONLY" = 1 ]; then echo "$BIN"; exit 0; fi
built() { [ -x "$BIN" ] && { [ -z "$CHECK" ] || "$BIN" "$CHECK" >/dev/null 2>&1; }; }
if built; then echo "$BIN"; exit 0; fi

mkdir -p "$DIR"
started=$(date +%s)
MODDIR="$( (cd / && go mod download -json "$TARGET" 2>"$DIR/build.log") \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
if [ ! -d "$MODDIR/$PACKAGE" ]; then
  echo "$TARGET: no $PACKAGE after go mod download" >&2; tail -20 "$DIR/build.log" >&2; exit 1
fi
(cd "$MODDIR" && GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GO111MODULE=on \
  go build -p "${GO_BUILD_PARALLEL:-2}" ${TAGS:+-tags "$TAGS"} -o "$BIN.tmp" "./$PACKAGE") \
  >>"$DIR/build.log" 2>&1 || { tail -20 "$DIR/build.log" >&2; exit 1; }
mv "$BIN.tmp" "$BIN"
echo "built $NAME ($TARGET) with ${GO_VERSION} in $(( $(date +%s) - started )) s" >>"$DIR/build.log"
built || { echo "$BIN does not answer ${CHECK}" >&2; exit 1; }
echo "$BIN"
