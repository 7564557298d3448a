#!/usr/bin/env bash
# Installs each supported SGLang release into its own directory, outside the project venv, so the
# launcher conformance test can parse kvgate's argv with that release's own
# `sglang.srt.server_args.prepare_server_args`, and the pool probes can size KV pools with that
# release's own `ModelConfig` and pool configurators. Nothing else in the project imports sglang.
#
#   tests/conformance/setup_env.sh [VERSION ...]      (default: the versions in SGLANG_VERSIONS)
#
# Layout: ${KVGATE_CACHE:-$HOME/.cache/kvgate}/conformance/sglang-<version>/ holds
#   sglang itself (pip --no-deps) and only the packages `sglang.srt.server_args` imports at start-up,
#   pinned as that release's own METADATA pins them. torch is NOT installed there: the test runs
#   the parse with the project venv's python (which has torch for the reference engine) and
#   PYTHONPATH=<that directory>.
# Idempotent: a directory stamped by this very script (its hash) is left alone; after an edit here
# the directory is installed afresh. Needs only PyPI.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${KVGATE_PYTHON:-$ROOT/.venv/bin/python}"
CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}/conformance"
SGLANG_VERSIONS="${SGLANG_VERSIONS:-0.5.19 0.5.20 0.5.21 0.5.22 0.5.23}"

# One install at a time: `make conformance` runs its tests in two workers, and each test module's
# fixture calls this script (a no-op once cached).
mkdir -p "$CACHE"
exec 9>"$CACHE/.setup.lock"
flock 9

# What `import sglang.srt.server_args` needs besides torch (checked by importing it on a CPU box).
IMPORT_TIME_PACKAGES=(numpy orjson psutil pybase64 requests transformers msgspec pyzmq pillow
  starlette ipython aiohttp packaging pydantic setproctitle)

# Releases before 0.5.21 import more at start-up (found the same way). The second list depends on
# torch, so those install without their dependencies (torch comes from the venv).
extra_packages() {
  case "$1" in 0.5.19 | 0.5.20) echo "openai partial_json_parser apache-tvm-ffi" ;; esac
}
extra_packages_without_deps() {
  case "$1" in 0.5.19 | 0.5.20) echo "xgrammar" ;; esac
}

# What the pool probes (llama4_pools_probe.py) import on top: `sglang.srt.configs.model_config`
# pulls in every quantization method and multimodal config (found by running the probe against
# each release on a CPU box). Installed --no-deps like the list above; the release's METADATA pin
# wins where it has one, else the version given here (the one the probe ran with).
PROBE_PACKAGES=(torchvision==0.29.2 dill==0.4.1 compressed-tensors==0.18.0 loguru==0.7.3
  gguf==0.19.0 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 einops==0.8.2)

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup_env.sh: $PY cannot import torch; install it first ('$PY -m pip install torch')" >&2
  exit 3
fi

# Turn a package name into the requirement the release's METADATA pins (or the bare name).
pinned() {
  local metadata="$1" name="$2" line
  line="$(grep -i -m1 -E "^Requires-Dist: ${name}([<>=!~ ;\[]|$)" "$metadata" || true)"
  line="${line#Requires-Dist: }"
  line="${line%%;*}"
  # drop extras such as [cu13]
  line="$(echo "$line" | sed -E 's/\[[^]]*\]//; s/ +$//')"
  echo "${line:-$name}"
}

STAMP=".kvgate-complete-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"

for version in ${@:-$SGLANG_VERSIONS}; do
  target="$CACHE/sglang-$version"
  if [[ -f "$target/$STAMP" ]]; then
    echo "sglang $version: ready in $target"
    continue
  fi
  echo "sglang $version: installing into $target"
  rm -rf "$target"
  mkdir -p "$target"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" \
    "sglang==$version"
  metadata="$(ls -d "$target"/sglang-"$version".dist-info)/METADATA"
  reqs=()
  for name in "${IMPORT_TIME_PACKAGES[@]}" $(extra_packages "$version"); do
    reqs+=("$(pinned "$metadata" "$name")")
  done
  # Their own dependencies come along; torch is not among them.
  "$PY" -m pip install --quiet --disable-pip-version-check --target "$target" "${reqs[@]}" \
    2> >(grep -v "already exists. Specify --upgrade" >&2)
  nodeps=()
  for name in $(extra_packages_without_deps "$version"); do
    nodeps+=("$(pinned "$metadata" "$name")")
  done
  for requirement in "${PROBE_PACKAGES[@]}"; do
    from_metadata="$(pinned "$metadata" "${requirement%%==*}")"
    if [[ "$from_metadata" == *[=\<\>~]* ]]; then
      nodeps+=("$from_metadata")
    else
      nodeps+=("$requirement")
    fi
  done
  if ((${#nodeps[@]})); then
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" \
      "${nodeps[@]}"
  fi
  if [[ -d "$target/torch" ]]; then
    echo "setup_env.sh: torch was pulled into $target; it must come from the venv" >&2
    exit 4
  fi
  touch "$target/$STAMP"
  echo "sglang $version: ready in $target"
done
