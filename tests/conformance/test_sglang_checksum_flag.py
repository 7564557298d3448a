"""Conformance: kvgate passes ``--disaggregation-enable-kv-checksum`` to exactly the releases whose
own parser has it.

For each supported release, kvgate's default argv (both roles) is parsed by that release's
``prepare_server_args`` with and without the flag: where the release accepts it kvgate must pass
it (and the parsed ``disaggregation_enable_kv_checksum`` is True), where the release exits 2 on it
kvgate must leave it out, and status.<role>.engineDefences must say it is off and why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.objects.engine_defences import engine_defences
from test_sglang_argv import (
    SUPPORTED_VERSIONS,
    engine_argv,
    model_dir,
    parse_with_sglang,
    sglang_envs,
)

pytestmark = pytest.mark.conformance

__all__ = ["model_dir", "sglang_envs"]  # the module fixtures this file uses

FLAG = "--disaggregation-enable-kv-checksum"


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_checksum_flag_is_passed_exactly_where_the_release_parses_it(
    version: str, sglang_envs: dict[str, Path], model_dir: Path
) -> None:
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.1-8b", "path": str(model_dir), "contextLength": 131072},
            "engine": {"image": f"lmsysorg/sglang:v{version}"},
        }
    )
    argvs = {role: engine_argv(spec, role)[3:] for role in (Role.PREFILL, Role.DECODE)}
    without = {role: [a for a in argv if a != FLAG] for role, argv in argvs.items()}
    inputs = [*argvs.values(), *([*argv, FLAG] for argv in without.values())]
    results = parse_with_sglang(sglang_envs[version], inputs, model_dir)
    kvgates, forced = results[:2], results[2:]
    release_has_it = all(r["exit"] == 0 for r in forced)
    assert release_has_it or all(r["exit"] == 2 for r in forced), (version, forced)
    for role, result in zip(argvs, kvgates, strict=True):
        assert result["exit"] == 0, f"SGLang {version} refused kvgate's {role.value} argv"
        assert (FLAG in argvs[role]) is release_has_it, (
            f"SGLang {version} {'has' if release_has_it else 'lacks'} {FLAG}; kvgate "
            f"{'passes' if FLAG in argvs[role] else 'omits'} it"
        )
        assert bool(result["values"]["disaggregation_enable_kv_checksum"]) is release_has_it
    checksum = {d.name: d for d in engine_defences(spec)}["kvChecksum"]
    assert checksum.enabled is release_has_it
    if not release_has_it:
        assert f"SGLang {version}" in checksum.message
