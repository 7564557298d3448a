"""`kvgate validate FILE`: exit 0 allowed, 1 denied; every problem printed with its field."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from factories.admission_reviews import SAMPLE, SAMPLE_WITH_WEIGHTS, mutated
from kvgate.cmd.cli import main


def _write(tmp_path: Path, text: str, name: str = "md.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_safe_sample_validates_with_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SAMPLE)]) == 0
    assert "ModelDeployment/llama-8b: allowed" in capsys.readouterr().out


def test_the_sample_without_a_source_is_allowed_with_a_warning_and_the_readmes_has_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["validate", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert (
        "  warning: spec.model.path: /models/llama-3.1-8b is under /models, where kvgate mounts "
        "the weights, but spec.model.source is not set" in out
    )
    assert main(["validate", str(SAMPLE_WITH_WEIGHTS)]) == 0
    assert "warning:" not in capsys.readouterr().out


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


# What `validate` says must be what the cluster says (issue 47 item 2).


@pytest.mark.parametrize(
    ("dotted", "value", "camel"),
    [
        ("spec.model.context_length", 131072, "contextLength"),
        ("spec.prefill.mem_fraction_static", 0.3, "memFractionStatic"),
        ("spec.engine.kv_cache_dtype", "fp8_e4m3", "kvCacheDtype"),
    ],
)
def test_a_snake_case_key_is_denied_naming_the_camel_case_field_the_crd_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dotted: str, value: object, camel: str
) -> None:
    # The CRD is camelCase: the API server refuses (kubectl's strict field validation) or prunes
    # a snake_case key and the engine runs the default. validate must not read it as the field.
    doc = mutated({dotted: value})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 1
    out = capsys.readouterr().out
    assert f"error: {dotted}: unknown field; the API spells it {camel}" in out


def test_validate_checks_against_the_charts_engine_version_floor_by_default_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart_values = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "charts/kvgate/values.yaml").read_text()
    )
    floor = chart_values["engineVersionFloor"]
    path = _write(tmp_path, yaml.safe_dump(mutated({"spec.safety.minEngineVersion": "0.5.1"})))
    assert main(["validate", path]) == 1  # a default install denies it
    out = capsys.readouterr().out
    assert f"engine version floor {floor} (the chart's default engineVersionFloor" in out
    assert "spec.safety.minEngineVersion" in out
    assert main(["validate", path, "--min-version-floor", "none"]) == 0
    assert "no engine version floor (--min-version-floor none)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("toleration", "words"),
    [
        ({"key": "gpu", "operator": "Exist"}, "must be Exists or Equal (got 'Exist')"),
        ({"key": "gpu", "operator": "Exists", "value": "x"}, "must be empty when operator"),
        ({"operator": "Equal", "value": "x"}, "operator must be Exists when key is empty"),
        ({"key": "gpu", "effect": "NoScedule"}, "must be NoSchedule, PreferNoSchedule or"),
        (
            {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30},
            "only with effect NoExecute",
        ),
    ],
)
def test_a_toleration_kubernetes_would_refuse_is_denied_with_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], toleration: dict[str, object], words: str
) -> None:
    doc = mutated({"spec.decode.tolerations": [toleration]})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 1
    out = capsys.readouterr().out
    assert "error: spec.decode.tolerations[0]" in out
    assert words in out


@pytest.mark.parametrize("quantity", ["64GB!", "1.5.2", "ten", "64 Gi", "-1Gi"])
def test_a_quantity_kubernetes_cannot_parse_is_denied_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quantity: str
) -> None:
    doc = mutated({"spec.decode.resources": {"limits": {"memory": quantity}}})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 1
    out = capsys.readouterr().out
    assert f"error: spec.decode.resources.limits.memory: {quantity!r} is not a Kubernetes" in out


@pytest.mark.parametrize("quantity", ["64Gi", "500m", "1e3", "2", "0.5", "128974848", "129M"])
def test_a_quantity_kubernetes_parses_is_allowed(tmp_path: Path, quantity: str) -> None:
    doc = mutated({"spec.decode.resources": {"requests": {"memory": quantity}}})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 0


def test_other_kinds_in_a_multi_document_file_are_skipped_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "weights"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Ti"}}},
    }
    text = yaml.safe_dump(pvc) + "---\n" + yaml.safe_dump(mutated({}))
    assert main(["validate", _write(tmp_path, text)]) == 0
    out = capsys.readouterr().out
    assert "PersistentVolumeClaim/weights: skipped (not a ModelDeployment" in out
    assert "ModelDeployment/llama-8b: allowed" in out
    assert main(["validate", _write(tmp_path, text), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in payload["documents"]] == ["ModelDeployment/llama-8b"]
    assert payload["skipped"] == [
        {"name": "PersistentVolumeClaim/weights", "kind": "PersistentVolumeClaim"}
    ]


def test_an_unknown_kv_cache_dtype_is_answered_with_values_a_supported_release_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = mutated({"spec.engine.kvCacheDtype": "fp16"})
    assert main(["validate", _write(tmp_path, yaml.safe_dump(doc))]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "spec.engine.kvCacheDtype" in line)
    offered = line.split("(got")[0]
    assert "bfloat16" in offered
    assert not re.search(r"\bfloat16\b", offered)  # denied for every supported release
    assert "for a float16 model use auto" in line


def test_a_file_of_other_kinds_only_exits_2_naming_what_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert "holds no ModelDeployment (skipped 1 document(s) of other kinds: Pod/p)" in err
