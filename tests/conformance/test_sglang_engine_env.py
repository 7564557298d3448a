"""Conformance: every SGLang variable kvgate sets on an engine container is one that release reads.

For each supported release, the launcher's environment (both roles, each safety setting on and
off) is given to that release's own ``sglang.srt.environ.envs`` in a subprocess (the release on
its path, nothing else imports sglang): the name must be declared there, the value must parse
without SGLang's "Invalid value ... using default" warning and come back as kvgate meant it; and
the release's scheduler code (outside ``environ.py``) must call ``envs.<NAME>.get()``, so that
declaring it is not all the release does with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from factories.release_answers import ask_release
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.objects.engine_launch import engine_launch
from kvgate_engine.launcher import DEFERRED_KV_RELEASE_ENV, engine_env
from test_sglang_argv import SUPPORTED_VERSIONS, sglang_envs

pytestmark = pytest.mark.conformance

__all__ = ["sglang_envs"]  # the module fixture this file uses

# A name no release declares: the control that the probe can tell "declared" from not.
UNDECLARED = "SGLANG_KVGATE_NO_SUCH_VARIABLE"

# Runs inside the SGLang environment: for each environment, what the release's envs make of it.
ENV_READER = r"""
import json, os, sys, warnings
results = []
for env in json.load(sys.stdin):
    os.environ.update(env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from sglang.srt.environ import envs
        seen = {}
        for name in env:
            field = getattr(envs, name, None)
            if field is None or not hasattr(field, "get"):
                seen[name] = {"declared": False}
                continue
            seen[name] = {"declared": True, "value": field.get(), "default": field.default}
    for name in env:
        del os.environ[name]
    results.append({"seen": seen, "warnings": [str(w.message) for w in caught]})
print("KVGATE-RESULTS " + json.dumps(results))
"""


def launch_env(version: str, role: Role, *, on: bool) -> dict[str, str]:
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "path": "/models/m", "contextLength": 8192},
            "engine": {"image": f"lmsysorg/sglang:v{version}"},
            "safety": {"deferredDecodeKvRelease": on},
        }
    )
    return engine_env(engine_launch(spec, role))


def readers(release: Path, name: str) -> list[str]:
    """The release's modules (outside environ.py) that call ``envs.<name>.get()``."""
    srt = release / "sglang" / "srt"
    return sorted(
        str(path.relative_to(srt))
        for path in srt.rglob("*.py")
        if path.name != "environ.py" and f"envs.{name}.get()" in path.read_text(errors="replace")
    )


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_engine_variable_kvgate_sets_is_read_by_that_release(
    version: str, sglang_envs: dict[str, Path]
) -> None:
    release = sglang_envs[version]
    cases = [
        (role, on, launch_env(version, role, on=on))
        for role in (Role.PREFILL, Role.DECODE)
        for on in (True, False)
    ]
    assert all(DEFERRED_KV_RELEASE_ENV in env for _, _, env in cases), (
        f"kvgate sets no {DEFERRED_KV_RELEASE_ENV} for SGLang {version}"
    )
    control = {UNDECLARED: "true"}
    answers: list[dict[str, Any]] = ask_release(
        release, ENV_READER, [env for _, _, env in cases] + [control]
    )

    assert answers[-1]["seen"] == {UNDECLARED: {"declared": False}}, "the control was declared"
    for (role, on, env), answer in zip(cases, answers[:-1], strict=True):
        assert answer["warnings"] == [], f"SGLang {version} refused {env}: {answer['warnings']}"
        for name in env:
            seen = answer["seen"][name]
            assert seen["declared"], f"SGLang {version} does not declare {name} ({role.value})"
            assert seen["value"] is on, f"SGLang {version} read {name}={env[name]!r} as {seen}"
            assert readers(release, name), f"SGLang {version} declares {name} but never reads it"


def test_the_deferred_release_readers_are_the_decode_queue_and_the_transfer_managers(
    sglang_envs: dict[str, Path],
) -> None:
    """Where each release reads it: the decode transfer queue and the common KV manager that
    mooncake's and NIXL's prefill and decode threads consult (docs/rollouts.md cites these)."""
    for version in SUPPORTED_VERSIONS:
        found = readers(sglang_envs[version], DEFERRED_KV_RELEASE_ENV)
        assert found == ["disaggregation/common/conn.py", "disaggregation/decode.py"], (
            version,
            found,
        )
