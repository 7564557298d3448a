#!/usr/bin/env bash
# Build the e2e control plane (kvgate-k8s multi-call binary) and helm into a cache folder.
#
#   e2e/controlplane/build.sh            build if the cache is missing, else reuse it
#   e2e/controlplane/build.sh --force    rebuild even if the cache exists
#   e2e/controlplane/build.sh --print-dir   print the cache dir this checkout would use
#
# Output: <cache root>/<key>/{kvgate-k8s,helm,manifest.json}, and this checkout's symlink
# e2e/.build/current -> <cache root>/<key> (git-ignored). The cache root is outside the clone,
# ${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/e2e-build (override: KVGATE_E2E_BUILD_ROOT), so a fresh
# clone reuses an earlier clone's build. <key> hashes go.mod, go.sum, the Go sources, the Go
# version and every build flag, so sharing is safe: any change rebuilds, an unchanged tree costs
# nothing, and each checkout's `current` link names the build of its own sources. GOMODCACHE/GOCACHE are left at their defaults so
# modules and compiled packages persist across runs. Timing and peak memory go to <key>/build.log.
#
# Environment: K8S_GIT_VERSION (default v1.37.2), HELM_VERSION (default v3.22.0),
# GO_BUILD_PARALLEL (default 2), GOTOOLCHAIN (honoured if set; Go >= 1.26 is needed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E="$(dirname "$HERE")"
CACHE_ROOT="${KVGATE_E2E_BUILD_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/e2e-build}"
LINK_DIR="$E2E/.build"  # per checkout: holds the `current` link only

K8S_GIT_VERSION="${K8S_GIT_VERSION:-v1.37.2}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
PAR="${GO_BUILD_PARALLEL:-2}"

FORCE=0
PRINT_DIR=0
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    --print-dir) PRINT_DIR=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

export CGO_ENABLED=0
GO_VERSION="$(go env GOVERSION)"

# shellcheck source=k8s-version.sh
. "$HERE/k8s-version.sh"
K8S_LDFLAGS="-s -w${K8S_VERSION_LDFLAGS}"
# chartutil.k8sVersionMajor/Minor: the Kubernetes version helm assumes without a cluster
# (`helm template`, `helm lint`); plain `go install` leaves helm's v1.20 default.
HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
HELM_LDFLAGS+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${K8S_MAJOR} -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${K8S_MINOR}"
BUILD_FLAGS="-p ${PAR} -trimpath"

key="$(
  {
    echo "go=${GO_VERSION} cgo=${CGO_ENABLED} flags=${BUILD_FLAGS}"
    echo "k8s-ldflags=${K8S_LDFLAGS}"
    echo "helm=${HELM_VERSION} helm-ldflags=${HELM_LDFLAGS}"
    cat "$HERE/go.mod" "$HERE/go.sum" "$HERE"/*.go
  } | sha256sum | cut -c1-16
)"
OUT="$CACHE_ROOT/$key"

if [[ $PRINT_DIR == 1 ]]; then
  echo "$OUT"
  exit 0
fi

link_current() {
  mkdir -p "$LINK_DIR"
  ln -sfn "$OUT" "$LINK_DIR/current"
}

if [[ $FORCE == 0 && -x "$OUT/kvgate-k8s" && -x "$OUT/helm" && -f "$OUT/manifest.json" ]]; then
  link_current
  echo "build.sh: cache hit: $OUT (e2e/.build/current -> $OUT)"
  exit 0
fi

mkdir -p "$OUT"
LOG="$OUT/build.log"
: >"$LOG"
log() { echo "[build.sh $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# System-wide memory sampler: the peak of (MemTotal - MemAvailable) during the build, which
# includes the parallel compile/link processes (/usr/bin/time only sees the largest single one).
MEMPEAK_FILE="$OUT/.mempeak"
base_used_kb="$(awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{print t-a}' /proc/meminfo)"
(
  peak=0
  while :; do
    used="$(awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{print t-a}' /proc/meminfo)"
    ((used > peak)) && peak=$used && echo "$peak" >"$MEMPEAK_FILE"
    sleep 1
  done
) &
SAMPLER=$!
trap 'kill "$SAMPLER" 2>/dev/null || true' EXIT

progress() {
  # `go build -v` prints one package path per line: show every 100th, and anything else (errors).
  awk '/ |:/ {print; fflush(); next} {n++; if (n % 100 == 0) {printf "[build.sh] %d packages built (%s)\n", n, $0; fflush()}}'
}

timed() {
  # timed NAME cmd...: run with /usr/bin/time -v if present; record wall time and max RSS.
  local name="$1"
  shift
  local tf="$OUT/.time-$name"
  local start end rc=0
  start="$(date +%s)"
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -v -o "$tf" "$@" 2>&1 | tee -a "$LOG" | progress || rc=$?
  else
    "$@" 2>&1 | tee -a "$LOG" | progress || rc=$?
  fi
  end="$(date +%s)"
  local rss="n/a"
  if [[ -f "$tf" ]]; then
    rss="$(awk -F': ' '/Maximum resident set size/{printf "%.0f MiB", $2/1024}' "$tf")"
  fi
  log "$name: exit ${rc}, wall $((end - start)) s, max single-process RSS ${rss} (/usr/bin/time)"
  echo "$name $((end - start)) ${rss}" >>"$OUT/.timings"
  return "$rc"
}

total_start="$(date +%s)"
log "building into $OUT (go ${GO_VERSION}, ${BUILD_FLAGS}, k8s ${K8S_GIT_VERSION}, helm ${HELM_VERSION})"

log "step 1/3: go mod download (k8s module graph)"
(cd "$HERE" && timed mod-download go mod download)

log "step 2/3: go build kvgate-k8s (the long pole: ~15-40 min cold on 2 cores)"
(cd "$HERE" && timed kvgate-k8s go build -v ${BUILD_FLAGS} -ldflags "${K8S_LDFLAGS}" -o "$OUT/kvgate-k8s.tmp" .)
mv "$OUT/kvgate-k8s.tmp" "$OUT/kvgate-k8s"

log "step 3/3: go install helm.sh/helm/v3/cmd/helm@${HELM_VERSION} (its own module graph)"
# `go install pkg@version` ignores the current module; run from / to make that obvious.
(cd / && GOBIN="$OUT/.helm-bin" timed helm go install -v ${BUILD_FLAGS} -ldflags "${HELM_LDFLAGS}" \
  "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}")
mv "$OUT/.helm-bin/helm" "$OUT/helm"
rmdir "$OUT/.helm-bin"

kill "$SAMPLER" 2>/dev/null || true
total_end="$(date +%s)"
peak_kb="$(cat "$MEMPEAK_FILE" 2>/dev/null || echo 0)"
peak_mib=$(((peak_kb - base_used_kb) / 1024))
log "done: total wall $((total_end - total_start)) s; system memory peak above baseline ${peak_mib} MiB"
"$OUT/kvgate-k8s" kubectl version --client 2>&1 | tee -a "$LOG" || true
"$OUT/helm" version 2>&1 | tee -a "$LOG" || true

cat >"$OUT/manifest.json" <<EOF
{
  "key": "${key}",
  "go_version": "${GO_VERSION}",
  "k8s_version": "${K8S_GIT_VERSION}",
  "helm_version": "${HELM_VERSION}",
  "build_flags": "${BUILD_FLAGS}",
  "total_wall_seconds": $((total_end - total_start)),
  "system_memory_peak_mib": ${peak_mib}
}
EOF
rm -f "$MEMPEAK_FILE"
link_current
log "ok: $OUT (e2e/.build/current -> $OUT)"

# Keep the newest KVGATE_E2E_KEEP_BUILDS builds (default 3, as clones of other revisions may
# share the cache); each is ~210 MB. A pruned build is rebuilt (mostly from GOCACHE) on demand.
keep="${KVGATE_E2E_KEEP_BUILDS:-3}"
find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn | tail -n +"$((keep + 1))" \
  | while read -r _ old; do
    [[ -f "$old/manifest.json" && "$old" != "$OUT" ]] && rm -rf "$old" && log "pruned old build $old"
  done
