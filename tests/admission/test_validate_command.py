"""`kvgate validate FILE`: exit 0 allowed, 1 denied; every problem printed with its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kvgate.cmd.cli import main

from .conftest import SAMPLE, mutated


def _write(tmp_path: Path, text: str, name: str = "md.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_safe_sample_validates_with_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SAMPLE)]) == 0
    assert "ModelDeployment/llama-8b: allowed" in capsys.readouterr().out


def test_unsafe_file_exits_one_and_prints_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = mutated({"spec.decode.gpuMemoryGiB": 25, "spec.engine.image": "lmsysorg/sglang:v0.5.20"})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 1
    out = capsys.readouterr().out
    assert "ModelDeployment/llama-8b: denied" in out
    assert "error: spec.decode: estimated KV pool 44,236 tokens < contextLength 131,072" in out
    assert "error: spec.engine.image: lmsysorg/sglang:v0.5.20 is SGLang 0.5.20" in out


def test_warnings_are_printed_but_do_not_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = mutated({"spec.engine.image": "lmsysorg/sglang:latest"})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 0
    assert "warning: spec.engine.image: lmsysorg/sglang:latest names no version" in (
        capsys.readouterr().out
    )


def test_json_output_lists_denials_with_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = mutated({"spec.prefill.memFractionStatic": 1.5})
    assert main(["validate", _write(tmp_path, json.dumps(doc), "md.json"), "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["allowed"] is False
    [document] = payload["documents"]
    assert document["denials"] == [
        {
            "field": "spec.prefill.memFractionStatic",
            "message": "must be < 1 (got 1.5); set a value between 0 and 1, e.g. 0.85",
        }
    ]


def test_every_document_in_a_multi_document_file_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = mutated({})
    bad = mutated({"metadata.name": "bad", "spec.decode.replicas": -3})
    text = yaml.safe_dump(good) + "---\n" + yaml.safe_dump(bad) + "---\n"
    assert main(["validate", _write(tmp_path, text)]) == 1
    out = capsys.readouterr().out
    assert "ModelDeployment/llama-8b: allowed" in out
    assert "ModelDeployment/bad: denied" in out
    assert "spec.decode.replicas: must be >= 0 (got -3)" in out


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("spec: [unclosed", "cannot read"),
        ("", "holds no document"),
        ("- just\n- a list\n", "must be a ModelDeployment object"),
    ],
)
def test_unreadable_or_foreign_files_are_denied_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
) -> None:
    assert main(["validate", _write(tmp_path, text)]) == 1
    assert words in capsys.readouterr().out


def test_missing_file_is_denied_naming_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/md.yaml"]) == 1
    assert "cannot read /nonexistent/md.yaml" in capsys.readouterr().out
