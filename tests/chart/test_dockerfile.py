"""operator/Dockerfile, read statically (no image can be built here): pinned base, non-root user,
no secrets, only the operator's dependencies, `kvgate operator` as the entry point, and the name
the chart's default image points at."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "operator" / "Dockerfile"
DOCKERIGNORE = ROOT / "operator" / "Dockerfile.dockerignore"
CHART = ROOT / "charts" / "kvgate"

SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|API_?KEY|PRIVATE|CREDENTIAL", re.I)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions, with comments dropped and `\\` continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, argument = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), argument.strip()))
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[starts[-1] :]


def _values() -> dict[str, object]:
    values: dict[str, object] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_every_base_image_is_a_slim_python_pinned_to_a_patch_version(
    instructions: list[Instruction],
) -> None:
    bases = [ins.argument.split()[0] for ins in instructions if ins.keyword == "FROM"]
    assert bases, "no FROM"
    for base in bases:
        assert re.fullmatch(
            r"python:3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", base
        ), f"base image {base!r} is not pinned to python:3.11.<patch>-slim-<debian>"


def test_final_stage_runs_as_a_numeric_non_root_user(instructions: list[Instruction]) -> None:
    users = [ins.argument for ins in _final_stage(instructions) if ins.keyword == "USER"]
    assert users, "the final stage has no USER: the operator would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} is not a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # The chart's pod securityContext runs the same uid.
    assert _values()["runAsUser"] == int(uid)


def test_entrypoint_is_kvgate_operator_in_exec_form(instructions: list[Instruction]) -> None:
    entrypoints = [
        ins.argument for ins in _final_stage(instructions) if ins.keyword == "ENTRYPOINT"
    ]
    assert entrypoints, "no ENTRYPOINT"
    assert json.loads(entrypoints[-1]) == ["kvgate", "operator"]
    assert not [ins for ins in _final_stage(instructions) if ins.keyword == "CMD"]


def test_no_secrets_are_baked_into_the_image(instructions: list[Instruction]) -> None:
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*=", ins.argument) or [
                ins.argument.split()[0]
            ]
            for name in names:
                assert not SECRET_WORDS.search(name), f"{ins.keyword} {name} looks like a secret"
        if ins.keyword in ("COPY", "ADD"):
            assert not re.search(
                r"\.env\b|kubeconfig|\.kube|id_rsa|\.pem|\.key|\.netrc|\.pypirc", ins.argument
            ), f"{ins.keyword} {ins.argument} copies credentials"
        if ins.keyword == "RUN":
            assert not re.search(r"--password|--token|https?://[^/\s]+:[^@\s]+@", ins.argument)
        assert ins.keyword != "ADD" or not ins.argument.startswith("http"), "ADD from a URL"


def test_image_installs_the_operator_without_reference_or_test_extras(
    instructions: list[Instruction],
) -> None:
    installs = [
        ins.argument
        for ins in instructions
        if ins.keyword == "RUN" and re.search(r"pip install", ins.argument)
    ]
    assert installs, "the image installs nothing"
    for command in installs:
        assert "torch" not in command.replace('import torch"', "")
        assert "[reference" not in command and "[test" not in command and ",test]" not in command
        assert re.search(r"pip install (--[a-z-]+ )*\.(\s|$)", command), command
    copied = " ".join(ins.argument for ins in instructions if ins.keyword == "COPY")
    for package in ("operator/kvgate", "engine/kvgate_engine", "pyproject.toml"):
        assert package in copied
    assert "tests" not in copied.split()


def test_build_context_sends_only_the_packages_and_no_local_environment() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "the ignore file must exclude everything by default"
    allowed = [p for p in patterns if p.startswith("!")]
    assert not any(".venv" in p or ".git" in p or "e2e/.build" in p for p in allowed)


def test_chart_default_image_is_the_one_the_dockerfile_documents() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = _values()["image"]
    assert isinstance(image, dict)
    assert image["tag"] == "", "the default tag must follow appVersion"
    reference = f"{image['repository']}:{chart['appVersion']}"
    assert f"-t {reference} " in DOCKERFILE.read_text()
    assert f"-t {reference} " in (CHART / "README.md").read_text()
