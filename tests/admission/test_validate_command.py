"""`kvgate validate FILE`: exit 0 allowed, 1 denied; every problem printed with its field."""

from __future__ import annotations

import json
import time
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


def test_a_document_that_is_not_a_model_deployment_is_denied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", _write(tmp_path, "- just\n- a list\n")]) == 1
    assert "must be a ModelDeployment object" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("spec: [unclosed", "is not YAML"),
        ("", "is empty; pass a ModelDeployment"),
        ("---\n---\n", "holds no document; pass a ModelDeployment"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "is not UTF-8 text (byte 0x89 at offset 0"),
    ],
    ids=["not yaml", "empty", "only separators", "binary"],
)
def test_a_file_that_cannot_be_read_as_yaml_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, words: str
) -> None:
    path = tmp_path / "md.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"kvgate validate: {path}: ")
    assert words in err


def test_missing_file_exits_2_naming_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/md.yaml"]) == 2
    assert capsys.readouterr().err == (
        "kvgate validate: /nonexistent/md.yaml: cannot read it: No such file or directory; "
        "pass a ModelDeployment YAML or JSON file\n"
    )


def _billion_laughs(levels: int) -> str:
    """The sample with 10^levels strings behind a few hundred bytes of YAML aliases."""
    lines = [
        "x-anchors:",
        '  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for level in range(1, levels):
        lines.append(f"  a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * 10) + "]")
    bomb = f"torch_dtype: bfloat16\n      laughs: *a{levels - 1}"
    return "\n".join(lines) + "\n" + SAMPLE.read_text().replace("torch_dtype: bfloat16", bomb)


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A million strings behind 600 bytes of aliases: refused at parse, in well under a second
    (it took a second and 90 MB to be denied as oversized; 10^9 took 21 s and 2 GB and was
    reported as a kvgate bug)."""
    path = _write(tmp_path, _billion_laughs(6))
    started = time.process_time()  # CPU: the load of a shared machine is not the claim
    assert main(["validate", path]) == 2
    elapsed = time.process_time() - started
    err = capsys.readouterr().err
    assert err == (
        f"kvgate validate: {path}: document 1 expands to more than 65,536 values through YAML "
        "aliases (*name); kvgate reads at most what a 1 MiB request could hold: write the "
        "values out, or use fewer aliases\n"
    )
    assert elapsed < 1.0


def test_a_recursive_yaml_alias_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "kind: ModelDeployment\nspec: &spec\n  model: {config: *spec}\n"
    path = _write(tmp_path, text)
    assert main(["validate", path]) == 2
    assert "document 1 refers to itself through a YAML alias (*spec)" in capsys.readouterr().err


def test_a_file_above_the_webhooks_request_cap_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "md.yaml"
    path.write_bytes(b"# " + b"x" * 2**20 + b"\n" + SAMPLE.read_bytes())
    assert main(["validate", str(path)]) == 2
    assert (
        f"{path}: is larger than the 1 MiB kvgate reads (the webhook's request cap)"
        in capsys.readouterr().err
    )


def test_a_tensor_parallel_that_does_not_divide_the_heads_is_denied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = mutated({"spec.prefill.tensorParallel": 3})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 1
    assert (
        "error: spec.prefill.tensorParallel: 3 does not divide the model's 32 attention heads"
        in capsys.readouterr().out
    )


def test_an_allowed_document_shows_each_roles_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(80 − 1) × 0.85 − 15 = 52.15 GiB per GPU; 52.15 × 2^30 / 131,072 bytes = 427,212 tokens."""
    assert main(["validate", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    for role in ("prefill", "decode"):
        assert (
            f"  estimate: {role} KV pool 427,212 tokens per engine ≥ 131,072 required "
            "(contextLength 131,072 × headroom 1.0), margin +225.9%; 80 GiB × TP 1, bfloat16, "
            "memFractionStatic 0.85, weights 15 GiB, gpuReservedGiB 1 from kvgate's assumption, "
            "not a measurement: SGLang subtracts no fixed reserve (an estimate: every live "
            "engine is verified)\n"
        ) in out
    assert main(["validate", str(SAMPLE), "--json"]) == 0
    [document] = json.loads(capsys.readouterr().out)["documents"]
    assert [
        (e["role"], e["kv_pool_tokens"], e["required_pool_tokens"]) for e in document["estimates"]
    ] == [("prefill", 427_212, 131_072), ("decode", 427_212, 131_072)]


def test_json_output_has_the_schema_version_and_an_error_object_for_input_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(SAMPLE), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["schemaVersion"], payload["command"], payload["exit_code"]) == (
        1,
        "validate",
        0,
    )
    assert payload["error"] is None
    path = _write(tmp_path, "")
    assert main(["validate", path, "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {
        "schemaVersion": 1,
        "command": "validate",
        "exit_code": 2,
        "error": {"input": path, "message": "is empty; pass a ModelDeployment YAML or JSON file"},
    }


def _nested(levels: int) -> str:
    return "a: " + "[" * levels + "]" * levels + "\n"


def test_flow_collections_nested_past_the_bound_are_refused_naming_it_and_at_the_bound_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5,000 nested lists (10 KB) cost PyYAML's scanner 1.7 s of CPU, 10 s on a loaded machine,
    before they were refused: its cost grows with the square of the depth. The scan now stops at
    the 101st level."""
    deep = _write(tmp_path, _nested(5_000), "deep.yaml")
    assert main(["validate", deep]) == 2
    assert capsys.readouterr().err == (
        f"kvgate validate: {deep}: document 1 opens more than 100 flow collections ([ or {{) "
        "inside each other; kvgate reads at most that many (a ModelDeployment needs about 8): "
        "flatten it\n"
    )
    over = _write(tmp_path, _nested(101), "over.yaml")
    assert main(["validate", over]) == 2
    assert "opens more than 100 flow collections" in capsys.readouterr().err
    at_bound = _write(tmp_path, _nested(100), "at.yaml")
    assert main(["validate", at_bound]) == 1  # read, and denied for what it holds
    out, err = capsys.readouterr()
    assert err == ""
    assert "error: a: unknown field; remove it" in out


def test_the_nesting_refusal_names_the_document_that_nests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = SAMPLE.read_text() + "---\n" + _nested(500)
    path = _write(tmp_path, text)
    assert main(["validate", path]) == 2
    assert f"{path}: document 2 opens more than 100 flow collections" in capsys.readouterr().err
