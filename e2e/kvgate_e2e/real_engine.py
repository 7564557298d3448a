"""The released SGLang as the engine of the e2e world (real-engine mode).

The loopback kubelet maps ``lmsysorg/sglang:<tag>`` to kvgate's reference engine by default. A
node annotated ``e2e.kvgate.io/engine-runtime: sglang-cpu`` runs it instead as the released SGLang
of that tag, on CPU, from the environment ``e2e/sglang-cpu/install.sh`` installs (outside the
venv, one per release: ``${KVGATE_CACHE:-~/.cache/kvgate}/sglang-cpu/<version>``). Only the
cluster admin can annotate a node, so a tenant cannot switch a pod's runtime.

The container keeps exactly the argv kvgate's launcher built (with the world's usual ``--host``
rewrite to the pod IP); this module adds only what SGLang needs to run on a CPU, as found in
``research/sglang-cpu.md``, never anything that changes what kvgate verifies:

* flags ``--device cpu --attention-backend torch_native --disable-cuda-graph
  --max-running-requests 16 --sleep-on-idle``; prefill also ``--disable-overlap-schedule``,
  decode also ``--disaggregation-decode-retraction-backup cpu_tensor``;
* environment ``SGLANG_USE_CPU_ENGINE=1 CUDA_VISIBLE_DEVICES= HF_HUB_OFFLINE=1
  MOONCAKE_PROTOCOL=tcp``, prefill also ``SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1``, and the
  environment's ``PYTHONPATH`` and ``LD_LIBRARY_PATH`` (the ``libcuda.so.1`` stand-in);
* ``SGLANG_HOST_IP=<pod IP>``: this world's pods have their address on ``lo`` of a network
  namespace with no NIC and no route, where SGLang's own detection (``get_local_ip_auto``: routes,
  then NICs) finds nothing and the scheduler dies with "Can not get local ip" when it starts the
  mooncake transfer engine; a real pod has its IP on eth0. Found running the world, not in the
  research note (its machine had a network).

The KV pool of a CPU engine is sized from host RAM, so the pool a test wants comes from the
ModelDeployment's ``maxTotalTokens`` (``--max-total-tokens``). To run an engine "on less memory"
(as the restart scenario does with GPU memory), a node annotation
``e2e.kvgate.io/max-total-tokens: N`` (``kvgate_e2e.kubelet.node.MAX_TOTAL_TOKENS_ANNOTATION``)
makes the kubelet's image mapping (``kvgate_e2e.kubelet.images``, for the reference engine too)
append ``--max-total-tokens N`` (the last one wins in SGLang's parser): the real engine then
really starts with a pool of N tokens.
"""

from __future__ import annotations

import fcntl
import json
import random
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate_e2e.content_cache import cache_home

# Where spec.model.source is mounted in engine containers: kvgate.api.models.MODEL_MOUNT_PATH
# (not imported: the loopback kubelet imports this module and needs no pydantic).
MODEL_MOUNT_PATH = "/models"
RUNTIME_ANNOTATION = "e2e.kvgate.io/engine-runtime"
SGLANG_CPU = "sglang-cpu"
# The release an engine image whose tag names none (``latest``, a private mirror's ``prod``)
# stands for on this node, as a node's image store resolves such a tag: admission cannot read
# it from the image, only the live engine reports it. A tag with a version wins.
RELEASE_ANNOTATION = "e2e.kvgate.io/sglang-release"

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "e2e" / "sglang-cpu" / "install.sh"
MAKE_MODEL_SCRIPT = REPO / "e2e" / "sglang-cpu" / "make_tiny_llama.py"
DEFAULT_VERSION = "0.5.23"
IMAGE = f"lmsysorg/sglang:v{DEFAULT_VERSION}"

# The tiny Llama's ModelDeployment (the scenarios and the demo): a 4,096-token window on a
# verified pool of 8,192 tokens per engine (maxTotalTokens: on CPU the pool is sized from host
# RAM, so the cap is the honest way to give an engine the pool a test wants).
TINY_SERVED = "tiny-llama"
TINY_CONTEXT = 4096
TINY_POOL = 8192

CPU_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--max-running-requests",
    "16",
    # An idle scheduler waits on its sockets (up to 1 s) instead of spinning: on a 2-core
    # machine a spinning prefill and decode pin both cores for as long as they run.
    "--sleep-on-idle",
)
# --mem-fraction-static of every real engine on CPU. There the pool is capped by
# --max-total-tokens, and the fraction only sets how much of the host's free RAM may vanish
# between SGLang's two samples of it (before and after loading the weights,
# kv_cache_configurator._profile_available_bytes): the start fails unless the second is at least
# (1 - fraction) of the first. At 0.05, 5 % of ~17 GB free (0.85 GB) was too little while other
# servers started beside it (CI, stop 39: a unified server lost 8.6 % as the PD pair started and
# refused to start). At 0.5 half the free RAM may go; the pool is the same.
CPU_MEM_FRACTION_STATIC = 0.5
ROLE_FLAGS: Mapping[str, tuple[str, ...]] = {
    "prefill": ("--disable-overlap-schedule",),
    "decode": ("--disaggregation-decode-retraction-backup", "cpu_tensor"),
}
CPU_ENV: Mapping[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "MOONCAKE_PROTOCOL": "tcp",
}
ROLE_ENV: Mapping[str, Mapping[str, str]] = {
    "prefill": {"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1"},
}


class RealEngineError(ValueError):
    """The real engine cannot be started: the message names what is missing and the fix."""


def cache_root() -> Path:
    return cache_home() / "sglang-cpu"


@dataclass(frozen=True)
class SglangCpu:
    """One installed release: ``<root>/site`` (packages) and ``<root>/lib`` (shared libraries)."""

    version: str
    root: Path

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    def installed(self) -> bool:
        return any(self.root.glob(".kvgate-complete-*")) and (self.lib / "libcuda.so.1").exists()

    def env(self, role: str | None = None) -> dict[str, str]:
        """The environment a server of this release needs on CPU (``role``: prefill/decode)."""
        return {
            **CPU_ENV,
            **ROLE_ENV.get(role or "", {}),
            "PYTHONPATH": str(self.site),
            "LD_LIBRARY_PATH": str(self.lib),
        }


def sglang_cpu(version: str | None) -> SglangCpu:
    """The installed environment of ``version``; an error naming the install command if absent."""
    if version is None:
        raise RealEngineError(
            "real-engine mode needs an engine image whose tag names an SGLang version "
            f"(e.g. lmsysorg/sglang:v{DEFAULT_VERSION}), or the node annotation "
            f"{RELEASE_ANNOTATION}"
        )
    env = SglangCpu(version, cache_root() / version)
    if not env.installed():
        raise RealEngineError(
            f"SGLang {version} for CPU is not installed in {env.root}: run "
            f"`SGLANG_CPU_VERSIONS={version} {INSTALL_SCRIPT.relative_to(REPO)}` (make "
            "real-engine-deps does it for the releases the scenarios run)"
        )
    return env


@contextmanager
def one_real_pair_at_a_time() -> Iterator[None]:
    """Held by each real-engine scenario module for its whole run, whichever pytest-xdist worker
    (or session) runs it: a real PD pair on CPU takes ~6 GB of RSS (each engine's launcher,
    scheduler and detokenizer ~1 GB each) and both cores while it starts, so two at once beside
    the world would exhaust this machine. A flock on ``<cache>/real-engine-pair.lock``."""
    path = cache_home() / "real-engine-pair.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def flag_value(flags: Sequence[str], name: str) -> str | None:
    """The last value of ``--name X`` / ``--name=X`` in ``flags`` (argparse: the last one wins)."""
    value: str | None = None
    for i, arg in enumerate(flags):
        if arg == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def uses_real_engine(node_annotations: Mapping[str, str]) -> bool:
    return node_annotations.get(RUNTIME_ANNOTATION) == SGLANG_CPU


def node_release(tagged: str | None, node_annotations: Mapping[str, str]) -> str | None:
    """The release a real-engine container runs: its tag's, else the node's
    ``e2e.kvgate.io/sglang-release``."""
    return tagged or node_annotations.get(RELEASE_ANNOTATION)


def real_engine_command(
    flags: Sequence[str],
    version: str | None,
    *,
    python: str,
    pod_ip: str,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """argv and extra environment of one engine container on a real-engine node (the flags are
    the launcher's, ``--host`` already rewritten to the pod IP, with what the node adds)."""
    env = sglang_cpu(version)
    role = flag_value(flags, "--disaggregation-mode")
    extra = [*CPU_FLAGS, *ROLE_FLAGS.get(role or "", ())]
    argv = (python, "-m", "sglang.launch_server", *flags, *extra)
    return argv, {**env.env(role), "SGLANG_HOST_IP": pod_ip}


def unified_server_argv(
    python: str, model: str, served_model_name: str, *, host: str, port: int, context_length: int
) -> list[str]:
    """A unified (not disaggregated) real server of the tiny model, for the known answer."""
    return [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--context-length",
        str(context_length),
        "--max-total-tokens",
        str(2 * context_length),
        "--mem-fraction-static",
        str(CPU_MEM_FRACTION_STATIC),
        *CPU_FLAGS,
    ]


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def unified_server_port() -> int:
    """A free 127.0.0.1 port for the unified server, below the kernel's ephemeral range.

    The server binds its port ~1 min after it is chosen (SGLang loads first); a port from the
    ephemeral range (what binding port 0 gives) can meanwhile go to one of the world's relays
    (``World.forward`` binds port 0), and a relay to a prefill engine accepts a /generate and
    never answers. Nothing takes a port below the range unless asked for it by number."""
    low = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    candidates = list(range(max(1024, low - 10_000), low))
    random.shuffle(candidates)
    for port in candidates[:500]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RealEngineError(f"no free 127.0.0.1 port found below the ephemeral range ({low})")


def tiny_llama_md(
    name: str, model: Path, pool: str, *, claim: str | None = None, **role_changes: Any
) -> dict[str, Any]:
    """A ModelDeployment of the tiny Llama on the real SGLang (1 prefill, 1 decode, smg) for
    nodes labelled ``kvgate.io/pool=<pool>``; ``role_changes`` override both roles' fields.
    With ``claim``, the weights come from that PersistentVolumeClaim (``model.source``, mounted
    read-only at ``/models``, whose root holds the model), else from ``model``, a path the node
    itself has.

    What the CPU needs: ``safety.kvChecksum: false`` (SGLang 0.5.23's checksum asserts CUDA
    tensors, ``disaggregation/checksum.py``, and crashes prefill's warm-up on CPU; on GPUs it
    stays on) and ``memFractionStatic: CPU_MEM_FRACTION_STATIC`` (the pool is sized from host RAM;
    the cap is ``maxTotalTokens``). ``model.config`` is the model's own config.json, as a user
    gives it: kvgate's content check takes its probe token ids from inside ``vocab_size`` (384
    here)."""
    config_file = model / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else None
    role: dict[str, Any] = {
        "replicas": 1,
        "tensorParallel": 1,
        "memFractionStatic": CPU_MEM_FRACTION_STATIC,
        "maxTotalTokens": TINY_POOL,
        "nodeSelector": {"kvgate.io/pool": pool},
        **role_changes,
    }
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": TINY_SERVED,
                "path": MODEL_MOUNT_PATH if claim else str(model),
                "contextLength": TINY_CONTEXT,
                **({"config": config} if config is not None else {}),
                **({"source": {"persistentVolumeClaim": {"claimName": claim}}} if claim else {}),
            },
            "engine": {"image": IMAGE},
            "safety": {"headroom": 1.0, "kvChecksum": False},
            "prefill": dict(role),
            "decode": dict(role),
            "rollout": {"verifyTimeoutSeconds": 900},
        },
    }
