"""The exact ``python3 -m sglang.launch_server`` argv for one role of a ModelDeployment. Pure.

Every flag whose SGLang default depends on the machine is passed explicitly (notably
``--mem-fraction-static``, whose default depends on the GPU). User ``engine.args`` come last so
that they can override anything here; the live probe still verifies whatever results.

Version-gated flags (the version is read from the image tag):

- ``--disaggregation-enable-kv-checksum`` when ``safety.kvChecksum`` and the image is
  >= ``KV_CHECKSUM_MIN_VERSION`` (0.5.21: the first released wheel whose parser accepts it, as
  the conformance test shows);
- ``--kv-canary log`` when ``safety.kvCanary`` and the image is >= ``KV_CANARY_MIN_VERSION``
  (0.5.19: the oldest release we test, whose parser already accepts it — the research notes
  called it new in 0.5.23, the released wheels say otherwise).

The engine API key (``engine.apiKeySecretRef``) is passed as ``--api-key $(KVGATE_ENGINE_API_KEY)``:
Kubernetes expands the reference from the container's environment, which the pod template fills
from the Secret, so the key itself never appears in the Deployment.

When the tag names no version (``latest``, a digest), both are passed when asked for: every
release that can pass the live version gate (default floor 0.5.22) accepts both flags, and an
engine that does not would exit at start-up with the flag named, rather than run silently
without the protection the user asked for.
"""

from __future__ import annotations

import re

from kvgate.api import ModelDeploymentSpec, Role
from packaging.version import InvalidVersion, Version

KV_CHECKSUM_MIN_VERSION = Version("0.5.21")
KV_CANARY_MIN_VERSION = Version("0.5.19")
# The container environment variable holding the engine API key (kvgate.builders fills it from
# spec.engine.apiKeySecretRef; the guard sidecar reads the same name).
API_KEY_ENV = "KVGATE_ENGINE_API_KEY"

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


def engine_argv(spec: ModelDeploymentSpec, role: Role) -> list[str]:
    """The full command line of one engine container of ``role``."""
    role_spec = spec.prefill if role is Role.PREFILL else spec.decode
    engine = spec.engine
    version = image_version(engine.image)

    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        spec.model.path,
        "--served-model-name",
        spec.model.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(engine.port),
        "--context-length",
        str(spec.model.context_length),
        "--mem-fraction-static",
        _number(role_spec.mem_fraction_static),
        "--tp-size",
        str(role_spec.tensor_parallel),
        "--page-size",
        str(engine.page_size),
        "--kv-cache-dtype",
        str(engine.kv_cache_dtype),
        "--disaggregation-mode",
        str(role),
        "--disaggregation-transfer-backend",
        str(engine.transfer.backend),
    ]
    if engine.transfer.ib_devices:
        # sglang/srt/arg_groups/fields/disagg.py: one device or a comma-separated list, used by
        # mooncake and NIXL UCX alike.
        argv += ["--disaggregation-ib-device", ",".join(engine.transfer.ib_devices)]
    if engine.api_key_secret_ref is not None:
        argv += ["--api-key", f"$({API_KEY_ENV})"]
    if role is Role.PREFILL:
        argv += ["--disaggregation-bootstrap-port", str(engine.bootstrap_port)]
    if role_spec.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(role_spec.max_total_tokens)]
    argv.append("--enable-metrics")
    if spec.safety.kv_checksum and _at_least(version, KV_CHECKSUM_MIN_VERSION):
        argv.append("--disaggregation-enable-kv-checksum")
    if spec.safety.kv_canary and _at_least(version, KV_CANARY_MIN_VERSION):
        argv += ["--kv-canary", "log"]
    argv += engine.args
    return argv
