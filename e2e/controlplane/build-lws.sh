#!/usr/bin/env bash
# Build the LeaderWorkerSet controller (sigs.k8s.io/lws) for the e2e world, into a cache folder
# outside the clone. Never committed: neither the binary nor the fetched source.
#
#   e2e/controlplane/build-lws.sh               build if missing, print the binary's path
#   e2e/controlplane/build-lws.sh --print-path  print where it is (or would be) and exit
#   e2e/controlplane/build-lws.sh --print-module-dir
#                                               print the module's source dir in GOMODCACHE
#                                               (its config/ holds the CRDs and webhook manifests
#                                               the world applies; downloaded if missing)
#
# Source: the Go module proxy (sigs.k8s.io/lws/cmd at LWS_VERSION, default v0.9.0, which needs
# Go >= 1.26), built with LWS's own module graph (its go.mod/go.sum, like helm in build.sh) and
# the machine's Go; GOMODCACHE/GOCACHE stay at their defaults so modules and compiled
# packages persist. Version stamped like LWS's Makefile (sigs.k8s.io/lws/pkg/version).
# Cache: ${KVGATE_LWS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/lws}/<version>-<go>/lws-controller.
# `make e2e-deps` runs it. The first build takes minutes on 2 cores: on a shared machine run it
# under the e2e lock (`flock /tmp/kvgate-e2e.lock e2e/controlplane/build-lws.sh`).
set -euo pipefail

VERSION="${LWS_VERSION:-v0.9.0}"
ROOT="${KVGATE_LWS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/lws}"
GO_VERSION="$(go env GOVERSION)"
DIR="$ROOT/${VERSION}-${GO_VERSION}"
BIN="$DIR/lws-controller"

case "${1:-}" in
  --print-path) echo "$BIN"; exit 0 ;;
  --print-module-dir)
    (cd / && go mod download -json "sigs.k8s.io/lws@${VERSION}") | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
    exit 0 ;;
  "") ;;
  *) echo "build-lws.sh: unknown argument $1" >&2; exit 2 ;;
esac
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then echo "$BIN"; exit 0; fi

mkdir -p "$DIR"
started=$(date +%s)
MODDIR="$( (cd / && go mod download -json "sigs.k8s.io/lws@${VERSION}") | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[ -f "$MODDIR/cmd/main.go" ] || { echo "build-lws.sh: sigs.k8s.io/lws@${VERSION} not in the module cache" >&2; exit 1; }
LDFLAGS="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=${VERSION}"
# Built inside the module's own (read-only) source dir in GOMODCACHE: LWS's go.mod and go.sum
# as released. (`go install sigs.k8s.io/lws/cmd@v0.9.0` would do the same, but it first reads
# the proxy's version list for deprecations, which proxy.golang.org refuses for this module.)
# -trimpath and no VCS stamping: the same inputs give the same binary.
(cd "$MODDIR" && CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GO111MODULE=on \
  go build -p "${GO_BUILD_PARALLEL:-2}" -ldflags "$LDFLAGS" -o "$DIR/lws-controller.tmp" ./cmd) \
  >"$DIR/build.log" 2>&1 || { tail -20 "$DIR/build.log" >&2; exit 1; }
mv "$DIR/lws-controller.tmp" "$BIN"
echo "built sigs.k8s.io/lws ${VERSION} with ${GO_VERSION} in $(( $(date +%s) - started )) s" >>"$DIR/build.log"
"$BIN" --version >/dev/null
echo "$BIN"
