"""Conformance: every value of every API enum that becomes an engine flag, against every release.

For each supported SGLang release (each in its own environment, tests/conformance/setup_env.sh):

- every value kvgate's API offers for a flag (admission's list,
  ``kvgate.admission.engine_flags.API_ENGINE_FLAGS``: spec.engine.kvCacheDtype ->
  --kv-cache-dtype, spec.engine.transfer.backend -> --disaggregation-transfer-backend; and the
  role -> --disaggregation-mode) goes into the argv kvgate's launcher builds, which that
  release's own ``prepare_server_args`` parses. Admission's decision must be the parser's: a
  value admitted for an image of that release parses and is read as given, a denied one exits 2;
- kvgate's table (``kvgate_engine.sglang_choices``) must be exactly that release's parser's
  ``choices`` for each flag in it;
- the reference engine, emulating that release, accepts no value the release's parser refuses.

What each release's parser answers is cached by everything it depends on
(factories/release_answers.py); the comparisons run every time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from factories.release_answers import ask_release
from kvgate.admission.checks import check_document
from kvgate.admission.engine_flags import API_ENGINE_FLAGS
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate_engine.reference.args import build_parser
from kvgate_engine.sglang_choices import (
    DISAGGREGATION_MODE,
    FLAG_CHOICES,
    SUPPORTED_RELEASES,
    accepted_values,
)
from test_sglang_argv import (
    LLAMA_31_8B_CONFIG,
    SUPPORTED_VERSIONS,
    engine_argv,
    model_dir,
    sglang_envs,
)

pytestmark = pytest.mark.conformance

__all__ = ["model_dir", "sglang_envs"]  # module fixtures this file uses

SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"

# Runs inside one SGLang environment: each argv through prepare_server_args, and the parser's
# own `choices` of every flag that has them.
PARSER = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
choices = {}
for action in parser._actions:
    if action.choices is not None:
        for option in action.option_strings:
            choices[option] = [str(c) for c in action.choices]
request = json.load(sys.stdin)
results = []
for argv in request["argvs"]:
    try:
        args = prepare_server_args(argv)
    except SystemExit as exc:
        results.append({"exit": exc.code})
        continue
    except Exception as exc:
        results.append({"exit": "exception", "error": f"{type(exc).__name__}: {exc}"})
        continue
    results.append({"exit": 0, "values": {f: getattr(args, f, None) for f in request["fields"]}})
print("KVGATE-RESULTS " + json.dumps({"choices": choices, "results": results}))
"""


@dataclass(frozen=True)
class Case:
    """One API value of one engine flag, for one role's engine."""

    field: str  # the spec field, as admission names it
    flag: str
    value: str
    role: Role
    document: dict[str, Any]  # the ModelDeployment that carries it

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def _document(version: str, model_dir: Path, field: str | None, value: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["model"]["path"] = str(model_dir)
    doc["spec"]["model"]["config"] = LLAMA_31_8B_CONFIG
    doc["spec"]["engine"] = {"image": f"lmsysorg/sglang:v{version}"}
    if field is not None:
        node = doc
        *parents, last = field.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return doc


def cases(version: str, model_dir: Path) -> list[Case]:
    found = [
        Case(
            entry.field, entry.flag, value, role, _document(version, model_dir, entry.field, value)
        )
        for entry in API_ENGINE_FLAGS
        for value in entry.values
        for role in Role
    ]
    found += [
        Case(
            f"spec.{role.value}",
            DISAGGREGATION_MODE,
            role.value,
            role,
            _document(version, model_dir, None, ""),
        )
        for role in Role
    ]
    return found


def admitted(case: Case) -> bool:
    """kvgate's admission lets this value through (no denial names its field)."""
    result = check_document(case.document)
    return not any(problem.field == case.field for problem in result.denials)


def run_parser(target: Path, argvs: list[list[str]], fields: list[str], model: Path) -> Any:
    return ask_release(
        target, PARSER, {"argvs": argvs, "fields": fields}, reads=[model / "config.json"]
    )


@dataclass(frozen=True)
class Parsed:
    cases: list[Case]
    argvs: list[list[str]]
    results: list[dict[str, Any]]
    choices: dict[str, list[str]]  # option string -> the release parser's choices


@pytest.fixture(scope="module")
def parsed(sglang_envs: dict[str, Path], model_dir: Path) -> dict[str, Parsed]:
    """Every case's argv through each release's parser, once per module."""
    answers = {}
    for version in SUPPORTED_VERSIONS:
        found = cases(version, model_dir)
        argvs = [
            engine_argv(ModelDeploymentSpec.model_validate(case.document["spec"]), case.role)[3:]
            for case in found
        ]
        fields = sorted({case.dest for case in found})
        answer = run_parser(sglang_envs[version], argvs, fields, model_dir)
        assert len(answer["results"]) == len(found)
        answers[version] = Parsed(found, argvs, answer["results"], answer["choices"])
    return answers


def test_the_table_covers_exactly_the_releases_the_conformance_tier_installs() -> None:
    assert set(SUPPORTED_RELEASES) == set(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_api_engine_flag_value_is_admitted_exactly_when_that_release_parses_it(
    version: str, parsed: dict[str, Parsed]
) -> None:
    answer = parsed[version]
    wrong = []
    for case, argv, result in zip(answer.cases, answer.argvs, answer.results, strict=True):
        allowed = admitted(case)
        if allowed and result["exit"] != 0:
            wrong.append(
                f"SGLang {version} refuses {case.flag} {case.value} (exit {result['exit']}), "
                f"but kvgate admits {case.field} {case.value} for lmsysorg/sglang:v{version} "
                f"({case.role.value} engine)"
            )
        elif allowed and result["values"][case.dest] != case.value:
            wrong.append(
                f"SGLang {version} read {case.flag} {case.value} as "
                f"{result['values'][case.dest]!r} (argv {argv})"
            )
        elif not allowed and result["exit"] != 2:
            wrong.append(
                f"kvgate denies {case.field} {case.value} for SGLang {version}, but that "
                f"release's parser accepts {case.flag} {case.value} ({case.role.value} engine)"
            )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_kvgate_table_is_exactly_each_release_parsers_choices(
    version: str, parsed: dict[str, Parsed]
) -> None:
    choices = parsed[version].choices
    wrong = []
    for flag in FLAG_CHOICES:
        table = accepted_values(flag, version)
        actual = choices.get(flag)
        if actual is None:
            wrong.append(f"SGLang {version} has no choices for {flag}; the table lists {table}")
            continue
        for value in actual:
            if value not in (table or ()):
                wrong.append(
                    f"SGLang {version} accepts {flag} {value}, but kvgate's table leaves it out"
                )
        for value in table or ():
            if value not in actual:
                wrong.append(
                    f"SGLang {version} refuses {flag} {value}, but kvgate's table lists it"
                )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_reference_engine_accepts_no_value_the_release_it_emulates_refuses(
    version: str, parsed: dict[str, Parsed]
) -> None:
    choices = parsed[version].choices
    wrong = []
    compared = 0
    for action in build_parser(version)._actions:
        if action.choices is None or not action.option_strings:
            continue
        flag = action.option_strings[0]
        sglang = choices.get(flag)
        if sglang is None:
            continue  # SGLang takes any value there: nothing to refuse
        compared += 1
        mine = [str(c) for c in action.choices]
        extra = [value for value in mine if value not in sglang]
        if extra:
            wrong.append(f"the reference engine accepts {flag} {extra}; SGLang {version} refuses")
        if flag in FLAG_CHOICES and mine != sglang:
            wrong.append(f"{flag}: the reference engine's choices {mine} != SGLang's {sglang}")
    assert compared >= len(FLAG_CHOICES)
    assert not wrong, "\n".join(wrong)
