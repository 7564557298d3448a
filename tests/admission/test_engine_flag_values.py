"""Admission denies an engine flag value the requested SGLang release refuses (it exits 2)."""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import mutated
from kvgate.admission import check_document
from kvgate.admission.policy import ClusterPolicy
from kvgate_engine import sglang_choices
from kvgate_engine.sglang_choices import KV_CACHE_DTYPE, Since


def _problems(changes: dict[str, Any], policy: ClusterPolicy | None = None) -> Any:
    return check_document(mutated(changes), policy)


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23", "0.5.23.post1", "0.6.0"])
def test_float16_kv_cache_is_denied_naming_field_value_release_and_way_out(version: str) -> None:
    result = _problems(
        {"spec.engine.kvCacheDtype": "float16", "spec.engine.image": f"lmsysorg/sglang:v{version}"}
    )
    assert not result.allowed
    denial = next(d for d in result.denials if d.field == "spec.engine.kvCacheDtype")
    assert denial.message.startswith(f"float16 is not accepted by SGLang {version} ")
    assert "--kv-cache-dtype refuses it (the engine would exit 2 at start-up)" in denial.message
    allowed = denial.message.split(f"allowed for {version}: ", 1)[1].split("; ", 1)[0]
    assert allowed.split(", ") == ["auto", "fp8_e4m3", "fp8_e5m2", "bfloat16", "bf16", "mxfp8"]
    assert denial.message.endswith(
        "use auto (the model's own dtype, float16 for a float16 model) or bfloat16"
    )


def test_float16_denial_is_exactly_what_the_user_reads() -> None:
    result = _problems({"spec.engine.kvCacheDtype": "float16"})
    assert result.message == (
        "spec.engine.kvCacheDtype: float16 is not accepted by SGLang 0.5.23 "
        "(lmsysorg/sglang:v0.5.23), whose --kv-cache-dtype refuses it (the engine would exit 2 "
        "at start-up); allowed for 0.5.23: auto, fp8_e4m3, fp8_e5m2, bfloat16, bf16, mxfp8; use "
        "auto (the model's own dtype, float16 for a float16 model) or bfloat16"
    )


@pytest.mark.parametrize("dtype", ["auto", "fp8_e4m3", "fp8_e5m2", "bfloat16", "bf16", "mxfp8"])
def test_every_other_kv_cache_dtype_the_api_offers_is_admitted(dtype: str) -> None:
    result = _problems({"spec.engine.kvCacheDtype": dtype})
    assert not [d for d in result.denials if d.field == "spec.engine.kvCacheDtype"], result.message


@pytest.mark.parametrize("backend", ["mooncake", "mooncake_tcp", "nixl"])
def test_every_transfer_backend_the_api_offers_is_admitted(backend: str) -> None:
    result = _problems({"spec.engine.transfer": {"backend": backend}})
    assert not [d for d in result.denials if "transfer" in d.field], result.message


def test_unversioned_image_with_a_value_no_release_accepts_is_denied() -> None:
    result = _problems(
        {"spec.engine.kvCacheDtype": "float16", "spec.engine.image": "lmsysorg/sglang:latest"}
    )
    denial = next(d for d in result.denials if d.field == "spec.engine.kvCacheDtype")
    assert denial.message.startswith(
        "float16 is not accepted by any SGLang release lmsysorg/sglang:latest may be (at or "
        "above 0.5.22, SGLang 0.5.22 to 0.5.23)"
    )


@pytest.fixture
def kv_only_in_newer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table in which 0.5.23 added fp8_e5m2 to --kv-cache-dtype (the real table cannot show a
    value the API offers that one supported release refuses and another accepts)."""
    table = dict(sglang_choices.FLAG_CHOICES)
    table[KV_CACHE_DTYPE] = (
        Since("0.5.19", ("auto", "bfloat16", "fp8_e4m3")),
        Since("0.5.23", ("auto", "bfloat16", "fp8_e4m3", "fp8_e5m2")),
    )
    monkeypatch.setattr(sglang_choices, "FLAG_CHOICES", table)


@pytest.mark.usefixtures("kv_only_in_newer")
def test_a_value_is_denied_for_the_release_that_refuses_it_and_admitted_for_one_that_accepts() -> (
    None
):
    older = _problems(
        {"spec.engine.kvCacheDtype": "fp8_e5m2", "spec.engine.image": "lmsysorg/sglang:v0.5.22"}
    )
    denial = next(d for d in older.denials if d.field == "spec.engine.kvCacheDtype")
    assert denial.message == (
        "fp8_e5m2 is not accepted by SGLang 0.5.22 (lmsysorg/sglang:v0.5.22), whose "
        "--kv-cache-dtype refuses it (the engine would exit 2 at start-up); allowed for 0.5.22: "
        "auto, fp8_e4m3, bfloat16; use one of those"
    )
    newer = _problems(
        {"spec.engine.kvCacheDtype": "fp8_e5m2", "spec.engine.image": "lmsysorg/sglang:v0.5.23"}
    )
    assert newer.allowed, newer.message


@pytest.mark.usefixtures("kv_only_in_newer")
def test_unversioned_image_with_a_value_some_releases_refuse_is_a_warning() -> None:
    result = _problems(
        {"spec.engine.kvCacheDtype": "fp8_e5m2", "spec.engine.image": "lmsysorg/sglang:latest"}
    )
    assert result.allowed, result.message
    warning = next(w for w in result.warnings if w.field == "spec.engine.kvCacheDtype")
    assert "refused by SGLang 0.5.22 (--kv-cache-dtype)" in warning.message
    assert "pin a tag such as v0.5.23" in warning.message
    # a cluster floor at 0.5.23 leaves only releases that accept it
    floored = _problems(
        {
            "spec.engine.kvCacheDtype": "fp8_e5m2",
            "spec.engine.image": "lmsysorg/sglang:latest",
            "spec.safety.minEngineVersion": "0.5.23",
        },
        ClusterPolicy(min_engine_version_floor="0.5.23"),
    )
    assert not [w for w in floored.warnings if w.field == "spec.engine.kvCacheDtype"]


@pytest.mark.parametrize(
    ("args", "index", "field"),
    [
        (["--kv-cache-dtype", "fp16"], 0, "spec.engine.kvCacheDtype"),
        (["--log-level", "info", "--kv-cache-dtype=float16"], 2, "spec.engine.kvCacheDtype"),
        (["--kv-cache-dtype", "fp4_mx_block16"], 0, "spec.engine.kvCacheDtype"),
        (["--kv-canary", "on"], 0, "spec.safety.kvCanary"),
    ],
)
def test_engine_args_may_not_override_a_fixed_set_flag_kvgate_sets_with_any_value(
    args: list[str], index: int, field: str
) -> None:
    """Whatever the value (refused by the release or not), the API field is the one way to set
    it, and that value is checked against the release."""
    result = _problems({"spec.engine.args": args})
    denial = next(d for d in result.denials if d.field == f"spec.engine.args[{index}]")
    assert f"remove it and set {field}" in denial.message


def test_version_older_than_the_table_is_a_warning_not_a_guess() -> None:
    result = _problems(
        {
            "spec.engine.kvCacheDtype": "float16",
            "spec.engine.image": "lmsysorg/sglang:v0.5.10",
            "spec.safety.minEngineVersion": "0.5.10",
        }
    )
    assert not [d for d in result.denials if d.field == "spec.engine.kvCacheDtype"]
    warning = next(w for w in result.warnings if w.field == "spec.engine.kvCacheDtype")
    assert "SGLang 0.5.10 accepts (its table starts at 0.5.19)" in warning.message
