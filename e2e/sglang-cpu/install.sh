#!/usr/bin/env bash
# Installs the released SGLang for the e2e world's real-engine mode: SGLang itself on
# CPU, as ../shared research/sglang-cpu.md found it runs, in its own directory outside the project
# venv. Pods of a real-engine node run `<venv python> -m sglang.launch_server ...` with
# PYTHONPATH=<dir>/site and LD_LIBRARY_PATH=<dir>/lib (kvgate_e2e/real_engine.py).
#
#   e2e/sglang-cpu/install.sh [VERSION ...]          (default: 0.5.23)
#
# Layout of ${KVGATE_CACHE:-$HOME/.cache/kvgate}/sglang-cpu/<version>/:
#   site/  sglang (pip --no-deps: its own dependency set pins CUDA-only packages such as
#          flashinfer and deep-ep), the packages it needs on CPU with the versions pip resolves
#          for them, torch and triton at the release's own pins (torch's CUDA wheel runs on CPU;
#          sglang-kernel and xgrammar pin the same torch), sglang-kernel (imported at module load
#          even on the CPU path) and mooncake-transfer-engine-non-cuda (the prefill->decode KV
#          transfer). The nvidia-* CUDA libraries torch loads are mostly NOT installed here
#          (3.5 GB): the venv's own (CUDA 13, same sonames) are found on sys.path after this
#          directory; only one the venv lacks (libcurand) is;
#   lib/   libcuda.so.1 built from e2e/sglang-cpu/libcuda_stub.c (sgl_kernel's CUDA build links it;
#          every function reports CUDA_ERROR_NO_DEVICE) and Debian's libibverbs1 (mooncake links
#          it), unpacked from its .deb with dpkg-deb -x: nothing is installed into the system.
# Idempotent: a directory stamped by this very script (the hash of this file and the stub) is
# left alone; after an edit here it is installed afresh. Needs PyPI, Debian's apt sources
# (`apt-get download`) and gcc.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${KVGATE_PYTHON:-$ROOT/.venv/bin/python}"
CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}/sglang-cpu"
VERSIONS="${SGLANG_CPU_VERSIONS:-0.5.23}"
MOONCAKE="mooncake-transfer-engine-non-cuda==0.3.13.post1"

# What SGLang needs to start and serve a Llama on CPU, unified and prefill/decode (found by
# starting it; research/sglang-cpu.md). Pins come from the release's own METADATA where it has one.
PACKAGES=(numpy orjson psutil pybase64 requests transformers tokenizers msgspec pyzmq pillow
  fastapi uvicorn uvloop setproctitle sentencepiece tiktoken partial_json_parser compressed-tensors
  interegular aiohttp IPython python-multipart prometheus-client pydantic regex scipy tqdm
  watchfiles xxhash zstandard einops distro easydict blobfile packaging python-dateutil openai
  anthropic openai-harmony modelscope ninja nvidia-ml-py xgrammar llguidance gguf mistral_common
  torchvision dill soundfile sglang-kernel torch)
# CUDA runtime libraries: installed here only when the venv has none of that name (torch 2.14
# loads libcurand, which the venv's newer torch no longer brings); the others come from the
# venv, found on sys.path after this directory.
SKIP_REGEX='^(nvidia-.*|cuda-.*|cuda_.*)$'
DEBS=(libibverbs1 libnl-3-200 libnl-route-3-200)

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "sglang-cpu/install.sh: $PY cannot import torch; run 'make venv' first" >&2
  exit 3
fi
command -v gcc >/dev/null || {
  echo "sglang-cpu/install.sh: gcc is missing (apt-get install gcc): it builds the libcuda.so.1 stand-in" >&2
  exit 3
}

pinned() { # the requirement the release's METADATA pins for a package (or the bare name)
  local metadata="$1" name="$2" line
  line="$(grep -i -m1 -E "^Requires-Dist: ${name}([<>=!~ ;\[]|$)" "$metadata" || true)"
  line="${line#Requires-Dist: }"
  line="${line%%;*}"
  line="$(echo "$line" | sed -E 's/\[[^]]*\]//; s/ +$//')"
  echo "${line:-$name}"
}

STAMP=".kvgate-complete-$(cat "${BASH_SOURCE[0]}" "$HERE/libcuda_stub.c" | sha256sum | cut -c1-12)"
PIP=("$PY" -m pip --disable-pip-version-check)

for version in $VERSIONS; do
  target="$CACHE/$version"
  if [[ -f "$target/$STAMP" ]]; then
    echo "sglang $version (CPU): ready in $target"
    continue
  fi
  started=$SECONDS
  echo "sglang $version (CPU): installing into $target"
  rm -rf "$target"
  mkdir -p "$target/site" "$target/lib" "$target/tmp"
  "${PIP[@]}" install --quiet --no-deps --target "$target/site" "sglang==$version"
  metadata="$(ls -d "$target"/site/sglang-"$version".dist-info)/METADATA"
  reqs=()
  for name in "${PACKAGES[@]}"; do reqs+=("$(pinned "$metadata" "$name")"); done
  reqs+=("$MOONCAKE")
  # Resolve the whole set, then install every package but the CUDA libraries, without
  # dependencies (the resolution is already complete).
  "${PIP[@]}" install --quiet --dry-run --ignore-installed --report "$target/tmp/report.json" \
    "${reqs[@]}"
  mapfile -t resolved < <("$PY" - "$target/tmp/report.json" "$SKIP_REGEX" <<'PYEOF'
import importlib.metadata, json, re, sys
report = json.load(open(sys.argv[1]))
cuda = re.compile(sys.argv[2], re.I)
for item in report["install"]:
    meta = item["metadata"]
    if cuda.match(meta["name"]):
        try:
            importlib.metadata.distribution(meta["name"])
            continue  # the venv has this CUDA library (same major version, same sonames)
        except importlib.metadata.PackageNotFoundError:
            pass
    print(f"{meta['name']}=={meta['version']}")
PYEOF
  )
  "${PIP[@]}" install --quiet --no-deps --target "$target/site" "${resolved[@]}" \
    2> >(grep -v "already exists. Specify --upgrade" >&2)
  # Debian's libibverbs1 (and the libnl it links), unpacked, never installed as system packages.
  (
    cd "$target/tmp"
    apt-get download "${DEBS[@]}" >/dev/null 2>&1 || {
      apt-get update -qq && apt-get download "${DEBS[@]}"
    }
    for deb in *.deb; do dpkg-deb -x "$deb" unpacked; done
  )
  cp -a "$target"/tmp/unpacked/{usr/,}lib/x86_64-linux-gnu/lib*.so* "$target/lib/" 2>/dev/null || true
  [[ -e "$target/lib/libibverbs.so.1" ]] || {
    echo "sglang-cpu/install.sh: libibverbs.so.1 not found in Debian's ${DEBS[*]}" >&2
    exit 5
  }
  gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$target/lib/libcuda.so.1" "$HERE/libcuda_stub.c"
  rm -rf "$target/tmp"
  # The imports a server makes before it serves (fails here, not in a pod, when one is missing).
  env -u PYTHONHOME PYTHONPATH="$target/site" LD_LIBRARY_PATH="$target/lib" CUDA_VISIBLE_DEVICES= \
    SGLANG_USE_CPU_ENGINE=1 "$PY" -c \
    "import sgl_kernel, mooncake.engine, sglang.srt.entrypoints.http_server, torch; assert not torch.cuda.is_available()"
  touch "$target/$STAMP"
  echo "MEASURED sglang $version (CPU) installed in $((SECONDS - started)) s," \
    "$(du -sh "$target" | cut -f1) in $target"
done
