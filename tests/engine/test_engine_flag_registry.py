"""The per-release table of SGLang flag choices, and admission's list of the API fields that feed
those flags: no API enum reaches the engine's argv without being checked."""

from __future__ import annotations

import copy
import itertools
import types
import typing
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate.admission.engine_flags import API_ENGINE_FLAGS
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.objects.engine_launch import engine_launch
from kvgate_engine.launcher import engine_argv
from kvgate_engine.sglang_choices import (
    DISAGGREGATION_MODE,
    FLAG_CHOICES,
    KV_CACHE_DTYPE,
    NEWEST_CHECKED,
    SUPPORTED_RELEASES,
    accepted_values,
    refusing_releases,
)
from pydantic import BaseModel, ValidationError

SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"


def _enum_fields(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[StrEnum]]]:
    """Every scalar StrEnum field of ``model`` (recursively), as a dotted camelCase path."""
    for name, info in model.model_fields.items():
        alias = info.alias or name
        annotation = info.annotation
        options = (
            typing.get_args(annotation)
            if isinstance(annotation, types.UnionType) or typing.get_origin(annotation)
            else (annotation,)
        )
        for option in options:
            if isinstance(option, type) and issubclass(option, StrEnum):
                yield f"{path}.{alias}", option
            elif isinstance(option, type) and issubclass(option, BaseModel):
                yield from _enum_fields(option, f"{path}.{alias}")


def _with(spec: dict[str, Any], dotted: str, value: str) -> dict[str, Any]:
    changed = copy.deepcopy(spec)
    node = changed
    *parents, last = dotted.removeprefix("spec.").split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return changed


def _argv_flags_fed_by(path: str, enum: type[StrEnum]) -> set[str]:
    """The launcher flags whose value changes with the field at ``path``."""
    base = yaml.safe_load(SAMPLE.read_text())["spec"]
    fed: set[str] = set()
    for role in Role:
        argvs = []
        for member in enum:
            try:
                spec = ModelDeploymentSpec.model_validate(_with(base, path, member.value))
            except ValidationError:
                continue  # a value that needs other fields (e.g. a progressive rollout)
            argvs.append(engine_argv(engine_launch(spec, role)))
        for argv in argvs[1:]:
            assert len(argv) == len(argvs[0]), f"{path} changes the argv's shape"
            for index, (one, other) in enumerate(zip(argvs[0], argv, strict=True)):
                if one != other:
                    fed.add(argv[index - 1])
    return fed


def test_enum_walk_finds_the_fields_known_to_feed_engine_flags() -> None:
    """The control for the walk below: it sees the two fields that do become flag values."""
    paths = {path for path, _ in _enum_fields(ModelDeploymentSpec, "spec")}
    assert {"spec.engine.kvCacheDtype", "spec.engine.transfer.backend"} <= paths
    assert _argv_flags_fed_by(
        "spec.engine.kvCacheDtype",
        dict(_enum_fields(ModelDeploymentSpec, "spec"))["spec.engine.kvCacheDtype"],
    ) == {KV_CACHE_DTYPE}


def test_every_api_enum_that_becomes_an_engine_flag_value_is_checked_by_admission() -> None:
    registered = {entry.field: entry.flag for entry in API_ENGINE_FLAGS}
    registered.update(
        {entry.deprecated_field: entry.flag for entry in API_ENGINE_FLAGS if entry.deprecated_field}
    )
    for path, enum in _enum_fields(ModelDeploymentSpec, "spec"):
        for flag in _argv_flags_fed_by(path, enum):
            assert registered.get(path) == flag, (
                f"{path} ({enum.__name__}) becomes the value of {flag}, but "
                "kvgate.admission.engine_flags.API_ENGINE_FLAGS does not check it"
            )
            assert flag in FLAG_CHOICES, f"{flag} has no row in kvgate_engine.sglang_choices"


def test_admission_registry_lists_every_member_of_each_enum() -> None:
    fields = dict(_enum_fields(ModelDeploymentSpec, "spec"))
    for entry in API_ENGINE_FLAGS:
        assert entry.values == tuple(member.value for member in fields[entry.field])
        assert entry.flag in FLAG_CHOICES


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_every_fixed_set_value_the_launcher_passes_is_in_that_releases_row(version: str) -> None:
    """Values the launcher writes itself (--kv-canary log, the role's --disaggregation-mode)."""
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "path": "/m", "contextLength": 1024},
            "engine": {"image": f"lmsysorg/sglang:v{version}"},
            "safety": {"kvCanary": True, "kvChecksum": True},
        }
    )
    for role in Role:
        argv = engine_argv(engine_launch(spec, role))
        seen = [(flag, value) for flag, value in itertools.pairwise(argv) if flag in FLAG_CHOICES]
        assert (DISAGGREGATION_MODE, role.value) in seen
        for flag, value in seen:
            if flag == KV_CACHE_DTYPE or flag.startswith("--disaggregation-transfer"):
                continue  # from the API: admission checks them (above)
            assert value in (accepted_values(flag, version) or ()), (version, flag, value)


def test_rows_apply_from_their_release_on_and_the_newest_to_later_releases() -> None:
    assert "fp4_e2m1" in (accepted_values(KV_CACHE_DTYPE, "0.5.20") or ())
    assert "fp4_e2m1" not in (accepted_values(KV_CACHE_DTYPE, "0.5.21") or ())
    assert "fp4_e2m1" in (accepted_values(KV_CACHE_DTYPE, "0.5.21rc1") or ())
    assert accepted_values(KV_CACHE_DTYPE, "0.5.22.post1") == accepted_values(
        KV_CACHE_DTYPE, "0.5.21"
    )
    assert accepted_values(KV_CACHE_DTYPE, "0.7.0") == accepted_values(
        KV_CACHE_DTYPE, NEWEST_CHECKED
    )
    assert accepted_values(KV_CACHE_DTYPE, "0.5.18") is None
    assert accepted_values(KV_CACHE_DTYPE, "not-a-version") is None


def test_refusing_releases_names_each_supported_release_that_refuses_a_value() -> None:
    assert refusing_releases(KV_CACHE_DTYPE, "float16") == SUPPORTED_RELEASES
    assert refusing_releases(KV_CACHE_DTYPE, "fp4_e2m1") == ("0.5.21", "0.5.22", "0.5.23")
    assert refusing_releases(KV_CACHE_DTYPE, "bfloat16") == ()
