"""Engine flag values the requested SGLang release refuses. Pure.

Some spec fields become the value of an SGLang flag whose parser takes a fixed set
(:data:`API_ENGINE_FLAGS`). An engine given a value its release does not list exits 2 at start-up
and crash-loops, so admission denies it, naming the field, the value, the release and what that
release allows. Which release accepts what is ``kvgate_engine.sglang_choices`` (one table, checked
against every supported release's own parser by tests/conformance/test_engine_flag_values.py).

The release is the image tag's version. An image that names none could be any release at or
above the version floor: a value every such release refuses is denied, one that only some refuse
is a warning.

The same flags in ``spec.engine.args`` are denied whatever their value
(:mod:`kvgate.admission.engine_args`: kvgate sets them, and a value there would replace kvgate's),
so only the values of the API fields are checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvgate_engine.launcher import image_version
from kvgate_engine.sglang_choices import (
    KV_CACHE_DTYPE,
    NEWEST_CHECKED,
    OLDEST_CHECKED,
    SUPPORTED_RELEASES,
    TRANSFER_BACKEND,
    accepted_values,
)
from packaging.version import InvalidVersion, Version

from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import Problem
from kvgate.api.models import KvCacheDtype, ModelDeploymentSpec, TransferBackend


@dataclass(frozen=True)
class EngineFlagField:
    """A spec field whose value kvgate's launcher passes as the value of ``flag``."""

    field: str  # as admission names it
    flag: str
    values: tuple[str, ...]  # every value the API offers for the field
    read: Callable[[ModelDeploymentSpec], str]
    # value -> the way out when a release refuses it
    instead: Mapping[str, str]
    # A deprecated field that fills this one; when it is given, it is where the user wrote it.
    deprecated_field: str | None = None
    deprecated_given: Callable[[ModelDeploymentSpec], bool] = lambda spec: False

    def named(self, spec: ModelDeploymentSpec) -> str:
        """The field path to name in a problem with ``spec``."""
        if self.deprecated_field is not None and self.deprecated_given(spec):
            return self.deprecated_field
        return self.field


# Every API enum that becomes an engine flag value (the role -> --disaggregation-mode is not a
# field: both roles always exist; the conformance test checks both against every release).
API_ENGINE_FLAGS: tuple[EngineFlagField, ...] = (
    EngineFlagField(
        field="spec.engine.kvCacheDtype",
        flag=KV_CACHE_DTYPE,
        values=tuple(member.value for member in KvCacheDtype),
        read=lambda spec: spec.engine.kv_cache_dtype.value,
        instead={
            KvCacheDtype.FLOAT16.value: "use auto (the model's own dtype, float16 for a float16 "
            "model) or bfloat16",
        },
    ),
    EngineFlagField(
        field="spec.engine.transfer.backend",
        flag=TRANSFER_BACKEND,
        values=tuple(member.value for member in TransferBackend),
        read=lambda spec: spec.engine.transfer.backend.value,
        instead={},
        deprecated_field="spec.engine.transferBackend",
        deprecated_given=lambda spec: spec.engine.transfer_backend is not None,
    ),
)


def _floor(spec: ModelDeploymentSpec, policy: ClusterPolicy) -> Version | None:
    try:
        floor = Version(spec.safety.min_engine_version)
    except InvalidVersion:
        return None  # check_engine_version reports it
    cluster = policy.floor
    return cluster if cluster is not None and cluster > floor else floor


def _candidates(floor: Version) -> list[str]:
    """The checked releases an unversioned image may be: those at or above the floor, and the
    newest checked one (standing for newer releases) in any case."""
    found = [v for v in SUPPORTED_RELEASES if Version(v) >= floor]
    return found or [NEWEST_CHECKED]


def _allowed(flag: str, version: str, offered: tuple[str, ...]) -> tuple[str, ...]:
    values = accepted_values(flag, version) or ()
    return tuple(v for v in offered if v in values)


def _refusal(
    field: str,
    value: str,
    flag: str,
    version: str,
    image: str,
    offered: tuple[str, ...],
    instead: str | None,
) -> Problem:
    allowed = ", ".join(_allowed(flag, version, offered))
    return Problem(
        field,
        f"{value} is not accepted by SGLang {version} ({image}), whose {flag} refuses it (the "
        f"engine would exit 2 at start-up); allowed for {version}: {allowed}; "
        f"{instead or 'use one of those'}",
    )


def _check_value(
    spec: ModelDeploymentSpec,
    policy: ClusterPolicy,
    field: str,
    flag: str,
    value: str,
    offered: tuple[str, ...],
    instead: str | None,
) -> tuple[list[Problem], list[Problem]]:
    """Denials and warnings for one value; `offered` is what the API field allows."""
    image = spec.engine.image
    tagged = image_version(image)
    if tagged is not None:
        values = accepted_values(flag, tagged)
        if values is None:
            return [], [
                Problem(
                    field,
                    f"kvgate does not know which {flag} values SGLang {tagged} accepts (its "
                    f"table starts at {OLDEST_CHECKED}), so {value} is not checked; the engine "
                    "exits at start-up if it refuses it",
                )
            ]
        if value in values:
            return [], []
        return [_refusal(field, value, flag, tagged, image, offered, instead)], []
    floor = _floor(spec, policy)
    if floor is None:
        return [], []
    candidates = _candidates(floor)
    refusing = [v for v in candidates if value not in (accepted_values(flag, v) or ())]
    if not refusing:
        return [], []
    newest = candidates[-1]
    if len(refusing) == len(candidates):
        shown = refusing[0] if len(refusing) == 1 else f"{refusing[0]} to {refusing[-1]}"
        allowed = ", ".join(_allowed(flag, newest, offered))
        return [
            Problem(
                field,
                f"{value} is not accepted by any SGLang release {image} may be (at or above "
                f"{floor}, SGLang {shown}): their {flag} refuses it (the engine would exit 2 at "
                f"start-up); allowed for {newest}: {allowed}; {instead or 'use one of those'}",
            )
        ], []
    return [], [
        Problem(
            field,
            f"{value} is refused by SGLang {', '.join(refusing)} ({flag}), and {image} names no "
            f"version, so the engine may exit 2 at start-up; pin a tag such as "
            f"v{NEWEST_CHECKED}",
        )
    ]


def check_engine_flag_values(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """Each engine flag value kvgate would pass, against the requested release's choices (an
    admission Check)."""
    denials: list[Problem] = []
    warnings: list[Problem] = []
    for entry in API_ENGINE_FLAGS:
        value = entry.read(spec)
        found = _check_value(
            spec,
            policy,
            entry.named(spec),
            entry.flag,
            value,
            entry.values,
            entry.instead.get(value),
        )
        denials += found[0]
        warnings += found[1]
    return denials, warnings
