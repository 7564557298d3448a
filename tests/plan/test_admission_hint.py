"""A denied pool says the largest contextLength the shape holds and the smallest change that holds
the requested one, and following either advice gets the ModelDeployment admitted."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate.admission import check_document
from kvgate.cmd.cli import main

from .models import LLAMA_31_70B, mutated

HINT = re.compile(
    r"; this shape holds at most contextLength (?P<largest>[\d,]+); the smallest change that "
    r"holds (?P<context>[\d,]+): (?P<path>[a-z]+\.[A-Za-z]+) (?P<value>\S+) \(estimated pool "
    r"(?P<pool>[\d,]+) tokens\)$"
)


def _pool_denial(doc: dict[str, Any], role: str) -> str | None:
    for problem in check_document(doc).denials:
        if problem.field == f"spec.{role}":
            return problem.message
    return None


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text.replace(",", ""))
        except ValueError:
            pass
    return text


LLAMA_70B_ON_80 = {
    "spec.model.config": LLAMA_31_70B,
    "spec.model.weightsGiB": 131.5,
    "spec.prefill.gpuMemoryGiB": 141,
    "spec.prefill.tensorParallel": 2,
    "spec.decode.tensorParallel": 2,
}
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("small GPU", {"spec.decode.gpuMemoryGiB": 24}, "decode"),
    ("headroom", {"spec.prefill.gpuMemoryGiB": 37, "spec.safety.headroom": 1.2}, "prefill"),
    (
        "already fp8",
        {"spec.decode.gpuMemoryGiB": 18, "spec.engine.kvCacheDtype": "fp8_e4m3"},
        "decode",
    ),
    ("70B on 80 GiB TP 2", LLAMA_70B_ON_80, "decode"),
    ("70B, 64k", LLAMA_70B_ON_80 | {"spec.model.contextLength": 65_536}, "decode"),
]


@pytest.mark.parametrize(("name", "changes", "role"), CASES, ids=[c[0] for c in CASES])
def test_following_the_denials_advice_gets_the_deployment_admitted(
    name: str, changes: dict[str, Any], role: str
) -> None:
    doc = mutated(changes)
    message = _pool_denial(doc, role)
    assert message is not None and message.startswith("estimated KV pool")  # the old text leads
    found = HINT.search(message)
    assert found, message
    assert _number(found["context"]) == doc["spec"]["model"]["contextLength"]

    # The smallest change, applied alone, is admitted for that role.
    fixed = copy.deepcopy(doc)
    section, field = found["path"].split(".")
    fixed["spec"][section][field] = _number(found["value"])
    assert _pool_denial(fixed, role) is None, (found["path"], found["value"])

    # The largest contextLength the shape holds is admitted; one more token is not.
    largest = _number(found["largest"])
    assert isinstance(largest, int)
    assert _pool_denial(mutated(changes | {"spec.model.contextLength": largest}), role) is None
    over = mutated(changes | {"spec.model.contextLength": largest + 1})
    assert _pool_denial(over, role) is not None


def test_a_gpu_the_weights_fill_is_told_the_smallest_change_that_holds_the_context() -> None:
    doc = mutated({"spec.decode.gpuMemoryGiB": 16})
    message = _pool_denial(doc, "decode")
    assert message is not None and message.startswith("the weights leave no room for a KV pool")
    tail = message.split("; the smallest change that holds 131,072: ")
    assert len(tail) == 2, message
    path, value = tail[1].split(" ")[:2]
    fixed = copy.deepcopy(doc)
    section, field = path.split(".")
    fixed["spec"][section][field] = _number(value)
    assert _pool_denial(fixed, "decode") is None


def test_kvgate_validate_prints_the_advice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "md.yaml"
    path.write_text(yaml.safe_dump(mutated({"spec.decode.gpuMemoryGiB": 24})))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "error: spec.decode: estimated KV pool 44,236 tokens < contextLength 131,072" in out
    assert "this shape holds at most contextLength 44,236; the smallest change that holds " in out
