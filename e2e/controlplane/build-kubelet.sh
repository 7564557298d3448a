#!/usr/bin/env bash
# Build the kubelet of the e2e world's real nodes into a cache folder, from e2e/kubelet-build/:
# the same k8s.io/kubernetes version and staging replaces as the control plane (checked below),
# the same version stamp and flags as e2e/controlplane/build.sh.
#
#   e2e/controlplane/build-kubelet.sh              build if the cache is missing, else reuse it
#   e2e/controlplane/build-kubelet.sh --print-dir  print the cache dir this checkout would use
#
# Output: <cache root>/kubelet-<key>/kubelet, and this checkout's link e2e/.build/kubelet.
# <key> hashes the module's go.mod, go.sum and main.go, the Go version and every flag.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E="$(dirname "$HERE")"
SRC="$E2E/kubelet-build"
CACHE_ROOT="${KVGATE_E2E_BUILD_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/e2e-build}"
K8S_GIT_VERSION="${K8S_GIT_VERSION:-v1.37.2}"
PAR="${GO_BUILD_PARALLEL:-2}"

PRINT_DIR=0
for a in "$@"; do
  case "$a" in
    --print-dir) PRINT_DIR=1 ;;
    *) echo "build-kubelet.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

# One Kubernetes for the whole world: the kubelet module pins what the control plane pins.
replaces() { sed -n '/^replace (/,/^)/p' "$1"; }
kubernetes() { grep -E '^\s+k8s.io/kubernetes v' "$1"; }
if [[ "$(replaces "$HERE/go.mod")" != "$(replaces "$SRC/go.mod")" \
  || "$(kubernetes "$HERE/go.mod")" != "$(kubernetes "$SRC/go.mod")" ]]; then
  echo "build-kubelet.sh: e2e/kubelet-build/go.mod pins another Kubernetes than e2e/controlplane/go.mod:" >&2
  echo "copy the control plane's replace block and k8s.io/kubernetes version, then go mod tidy there" >&2
  exit 1
fi

export CGO_ENABLED=0
GO_VERSION="$(go env GOVERSION)"
# shellcheck source=k8s-version.sh
. "$HERE/k8s-version.sh"
LDFLAGS="-s -w${K8S_VERSION_LDFLAGS}"
BUILD_FLAGS="-p ${PAR} -trimpath"

key="$(
  {
    echo "go=${GO_VERSION} cgo=${CGO_ENABLED} flags=${BUILD_FLAGS}"
    echo "ldflags=${LDFLAGS}"
    cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go
  } | sha256sum | cut -c1-16
)"
OUT="$CACHE_ROOT/kubelet-$key"
if [[ $PRINT_DIR == 1 ]]; then
  echo "$OUT"
  exit 0
fi
link() { mkdir -p "$E2E/.build" && ln -sfn "$OUT" "$E2E/.build/kubelet"; }
if [[ -x "$OUT/kubelet" ]]; then
  link
  echo "build-kubelet.sh: cache hit: $OUT"
  exit 0
fi

mkdir -p "$OUT"
start="$(date +%s)"
(cd "$SRC" && go mod download && go build ${BUILD_FLAGS} -ldflags "${LDFLAGS}" -o "$OUT/kubelet.tmp" .)
mv "$OUT/kubelet.tmp" "$OUT/kubelet"
end="$(date +%s)"
echo "kubelet ${K8S_GIT_VERSION}: wall $((end - start)) s (go ${GO_VERSION}, ${BUILD_FLAGS})" | tee "$OUT/build.log"
"$OUT/kubelet" --version | tee -a "$OUT/build.log"
link
echo "build-kubelet.sh: ok: $OUT"
