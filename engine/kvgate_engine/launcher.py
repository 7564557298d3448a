"""The exact ``python3 -m sglang.launch_server`` argv for one role of a ModelDeployment. Pure.

Every flag whose SGLang default depends on the machine is passed explicitly (notably
``--mem-fraction-static``, whose default depends on the GPU). User ``engine.args`` come last so
that they can override anything here; the live probe still verifies whatever results.

Version-gated flags (the version is read from the image tag):

- ``--disaggregation-enable-kv-checksum`` when ``safety.kvChecksum`` and the image is
  >= ``KV_CHECKSUM_MIN_VERSION`` (0.5.21: the first released wheel whose parser accepts it, as
  the conformance test shows);
- ``--kv-canary log`` when ``safety.kvCanary`` and the image is >= ``KV_CANARY_MIN_VERSION``
  (0.5.19: the oldest release we test, whose parser already accepts it, as the conformance test
  shows).

Version-gated environment (:func:`engine_env`, on both roles):

- ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`` set to ``true`` when
  ``safety.deferredDecodeKvRelease`` (``false`` when not) and the image is
  >= ``DEFERRED_KV_RELEASE_MIN_VERSION`` (0.5.19: ``sglang/srt/environ.py`` declares it in every
  supported release, default ``EnvBool(False)`` in 0.5.19 and 0.5.20, ``EnvBool(True)`` from
  0.5.21). With it, an aborted request's decode pages stay held until prefill acknowledges that
  its in-flight KV write drained (``DecodeTransferQueue._deferred_releases``, ``decode.py``), or
  the ``..._TIMEOUT`` (30 s) passes. Both roles read it: the prefill side
  (``MooncakeKVManager.start_prefill_thread`` in ``mooncake/conn.py``, NIXL's ``conn.py``) holds
  its ``ABORT_ACK`` until the write drained only when it is on; without it decode waits for the
  timeout. From 0.5.21 it takes effect only on transfer backends that declare
  ``supports_deferred_decode_kv_release`` (mooncake and nixl; mori from 0.5.22).

The engine API key (``engine.apiKeySecretRef``) is passed as ``--api-key $(KVGATE_ENGINE_API_KEY)``:
Kubernetes expands the reference from the container's environment, which the pod template fills
from the Secret, so the key itself never appears in the Deployment.

When the tag names no version (``latest``, a digest), both are passed when asked for: every
release that can pass the live version gate (default floor ``DEFAULT_MIN_ENGINE_VERSION``)
accepts both flags, and an engine that does not would exit at start-up with the flag named,
rather than run silently without the protection the user asked for; the variable is set too
(a release that does not declare it ignores it).

The input is :class:`EngineLaunch`, plain values for one container: this package never imports
the operator's API models (``kvgate.objects.engine_launch`` maps a ModelDeployment role to it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

KV_CHECKSUM_MIN_VERSION = Version("0.5.21")
KV_CANARY_MIN_VERSION = Version("0.5.19")
DEFERRED_KV_RELEASE_MIN_VERSION = Version("0.5.19")
DEFERRED_KV_RELEASE_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
# The container environment variable holding the engine API key (kvgate.objects.builders fills
# it from spec.engine.apiKeySecretRef; the guard sidecar reads the same name).
API_KEY_ENV = "KVGATE_ENGINE_API_KEY"

EngineRole = Literal["prefill", "decode"]


@dataclass(frozen=True)
class EngineLaunch:
    """What one engine container's command line is made of, as plain values."""

    role: EngineRole
    image: str  # only its tag is read: the version that gates the safety flags
    model_path: str
    served_model_name: str
    port: int
    context_length: int
    mem_fraction_static: float
    tensor_parallel: int
    page_size: int
    kv_cache_dtype: str
    transfer_backend: str
    bootstrap_port: int  # passed to prefill only
    ib_devices: tuple[str, ...] = ()
    # --api-key $(API_KEY_ENV): the key comes from the container's environment, never the argv.
    api_key_from_env: bool = False
    max_total_tokens: int | None = None
    kv_checksum: bool = False
    kv_canary: bool = False
    deferred_decode_kv_release: bool = False
    # The user's engine.args, last so that they can override anything above.
    extra_args: tuple[str, ...] = ()
    # One engine over several pods (SGLang multi-node: --nnodes, --node-rank, --dist-init-addr).
    # node_rank and dist_init_addr may hold $(VAR) references that Kubernetes expands from the
    # container's environment (a LeaderWorkerSet worker learns its rank and its leader's address
    # only there). Both are passed only when nnodes > 1.
    nnodes: int = 1
    node_rank: str = "0"
    dist_init_addr: str | None = None

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"nnodes {self.nnodes}: an engine runs on 1 or more nodes")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError(
                f"nnodes {self.nnodes} needs dist_init_addr: the ranks meet at rank 0's address"
            )


# "v0.5.23", "0.5.23", "v0.5.19-cu129", "v0.5.23.post1", "v0.6.0rc1-cu130"
_TAG_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.post\d+|(?:a|b|rc)\d+)?)(?:[-_+].*)?$")


def image_version(image: str) -> str | None:
    """The SGLang version an image tag names: ``lmsysorg/sglang:v0.5.23`` -> ``0.5.23``.

    ``None`` for ``latest``, digest-only references and tags that name no version.
    """
    reference = image.split("@", 1)[0]
    last_segment = reference.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return None
    tag = last_segment.rsplit(":", 1)[1]
    match = _TAG_VERSION.match(tag)
    if match is None:
        return None
    try:
        return str(Version(match.group(1)))
    except InvalidVersion:
        return None


def _at_least(version: str | None, floor: Version) -> bool:
    return version is None or Version(version) >= floor


def _number(value: float) -> str:
    return repr(float(value))


def engine_argv(launch: EngineLaunch) -> list[str]:
    """The full command line of one engine container."""
    version = image_version(launch.image)

    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        launch.model_path,
        "--served-model-name",
        launch.served_model_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(launch.port),
        "--context-length",
        str(launch.context_length),
        "--mem-fraction-static",
        _number(launch.mem_fraction_static),
        "--tp-size",
        str(launch.tensor_parallel),
        "--page-size",
        str(launch.page_size),
        "--kv-cache-dtype",
        launch.kv_cache_dtype,
        "--disaggregation-mode",
        launch.role,
        "--disaggregation-transfer-backend",
        launch.transfer_backend,
    ]
    if launch.ib_devices:
        # sglang/srt/arg_groups/fields/disagg.py: one device or a comma-separated list, used by
        # mooncake and NIXL UCX alike.
        argv += ["--disaggregation-ib-device", ",".join(launch.ib_devices)]
    if launch.api_key_from_env:
        argv += ["--api-key", f"$({API_KEY_ENV})"]
    if launch.role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(launch.bootstrap_port)]
    if launch.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(launch.max_total_tokens)]
    if launch.nnodes > 1:
        # sglang/srt/arg_groups/fields/parallel.py. Rank 0 (the leader) serves HTTP and, for
        # prefill, the KV bootstrap server (disaggregation/common/conn.py: its host is the
        # dist-init address); ranks >= 1 run schedulers only.
        argv += [
            "--nnodes",
            str(launch.nnodes),
            "--node-rank",
            launch.node_rank,
            "--dist-init-addr",
            str(launch.dist_init_addr),
        ]
    argv.append("--enable-metrics")
    if launch.kv_checksum and _at_least(version, KV_CHECKSUM_MIN_VERSION):
        argv.append("--disaggregation-enable-kv-checksum")
    if launch.kv_canary and _at_least(version, KV_CANARY_MIN_VERSION):
        argv += ["--kv-canary", "log"]
    argv += launch.extra_args
    return argv


def engine_env(launch: EngineLaunch) -> dict[str, str]:
    """The SGLang environment variables kvgate sets on one engine container (name -> value).

    Written whether on or off wherever the release reads the variable, so the engine does what
    the spec says whatever the release's default is."""
    version = image_version(launch.image)
    env: dict[str, str] = {}
    if _at_least(version, DEFERRED_KV_RELEASE_MIN_VERSION):
        env[DEFERRED_KV_RELEASE_ENV] = "true" if launch.deferred_decode_kv_release else "false"
    return env
