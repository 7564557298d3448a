"""Which of SGLang's own KV defences an engine of a ModelDeployment role runs with, and why not.
Pure.

kvgate turns on what the release has (kvgate_engine.launcher gates each on the image tag's
version); status.<role>.engineDefences reports the outcome so that a defence that is off is
visible with its cause and the way to turn it on.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate_engine.launcher import (
    DEFERRED_KV_RELEASE_ENV,
    DEFERRED_KV_RELEASE_MIN_VERSION,
    KV_CHECKSUM_MIN_VERSION,
    image_version,
)
from packaging.version import Version

from kvgate.api.models import ModelDeploymentSpec


@dataclass(frozen=True)
class EngineDefence:
    """One defence: its spec.safety field name, whether the engine runs with it, and why."""

    name: str
    enabled: bool
    message: str


def _defence(name: str, what: str, asked: bool, image: str, since: Version) -> EngineDefence:
    version = image_version(image)
    if not asked:
        return EngineDefence(
            name, False, f"{what} off: spec.safety.{name} is false (set it to true to turn it on)"
        )
    if version is not None and Version(version) < since:
        return EngineDefence(
            name,
            False,
            f"{what} off: SGLang {version} (engine.image {image}) does not have it; it exists "
            f"from SGLang {since} (set engine.image to {since} or later)",
        )
    return EngineDefence(name, True, f"{what} on")


def engine_defences(spec: ModelDeploymentSpec) -> tuple[EngineDefence, ...]:
    """The defences both roles' engines run with (kvgate sets the same ones on each role)."""
    image = spec.engine.image
    return (
        _defence(
            "kvChecksum",
            "KV-transfer checksums (--disaggregation-enable-kv-checksum)",
            spec.safety.kv_checksum,
            image,
            KV_CHECKSUM_MIN_VERSION,
        ),
        _defence(
            "deferredDecodeKvRelease",
            f"deferred decode KV release ({DEFERRED_KV_RELEASE_ENV}=true)",
            spec.safety.deferred_decode_kv_release,
            image,
            DEFERRED_KV_RELEASE_MIN_VERSION,
        ),
    )
