"""Table tests: every admission check, allowed and denied, with the field and numbers named."""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import DELETE, mutated, sample, sample_with_weights
from kvgate.admission import check_document, check_update

# (case id, changes to the safe sample, field that must be denied, words the message must hold)
DENIED: list[tuple[str, dict[str, Any], str, list[str]]] = [
    ("headroom below 1", {"spec.safety.headroom": 0.9}, "spec.safety.headroom", ["0.9", ">= 1"]),
    (
        "mem fraction zero",
        {"spec.prefill.memFractionStatic": 0},
        "spec.prefill.memFractionStatic",
        ["> 0", "got 0"],
    ),
    (
        "mem fraction one",
        {"spec.decode.memFractionStatic": 1.0},
        "spec.decode.memFractionStatic",
        ["< 1", "got 1.0"],
    ),
    (
        "negative replicas",
        {"spec.prefill.replicas": -1},
        "spec.prefill.replicas",
        [">= 0", "got -1"],
    ),
    (
        "tensor parallel zero",
        {"spec.decode.tensorParallel": 0},
        "spec.decode.tensorParallel",
        [">= 1", "got 0"],
    ),
    (
        "engine before the fix",
        {"spec.engine.image": "lmsysorg/sglang:v0.5.20"},
        "spec.engine.image",
        ["0.5.20", "0.5.22"],
    ),
    (
        "engine below a raised floor",
        {"spec.safety.minEngineVersion": "0.5.24"},
        "spec.engine.image",
        ["0.5.23", "0.5.24"],
    ),
    (
        "unreadable floor",
        {"spec.safety.minEngineVersion": "soon"},
        "spec.safety.minEngineVersion",
        ["'soon'", "0.5.22"],
    ),
    (
        "cap below the context",
        {"spec.decode.maxTotalTokens": 100_000},
        "spec.decode.maxTotalTokens",
        ["100,000", "131,072"],
    ),
    (
        "context above the model",
        {"spec.model.contextLength": 262_144},
        "spec.model.contextLength",
        ["262,144", "131,072"],
    ),
    ("pool too small", {"spec.decode.gpuMemoryGiB": 25}, "spec.decode", ["44,236", "131,072"]),
    (
        "pool too small for headroom",
        {"spec.prefill.gpuMemoryGiB": 38, "spec.safety.headroom": 1.2},
        "spec.prefill",
        ["157,287", "1.2"],
    ),
    (
        "weights fill the GPU",
        {"spec.decode.gpuMemoryGiB": 17},
        "spec.decode",
        ["no room", "13.60 GiB", "15.00 GiB"],
    ),
    (
        "misspelt field",
        {"spec.model.contextLenght": 1},
        "spec.model.contextLenght",
        ["contextLength"],
    ),
    ("missing required", {"spec.model.name": DELETE}, "spec.model.name", ["required"]),
    (
        "unknown enum",
        {"spec.engine.kvCacheDtype": "fp9"},
        "spec.engine.kvCacheDtype",
        ["fp8_e4m3", "'fp9'"],
    ),
    (
        "string for integer",
        {"spec.prefill.replicas": "2"},
        "spec.prefill.replicas",
        ["integer", "'2'"],
    ),
    ("fractional page size", {"spec.engine.pageSize": 1.5}, "spec.engine.pageSize", ["1.5"]),
    (
        "infinite headroom",
        {"spec.safety.headroom": float("inf")},
        "spec.safety.headroom",
        ["finite", "inf"],
    ),
    (
        "integer beyond 64 bits",
        {"spec.model.contextLength": 2**70},
        "spec.model.contextLength",
        ["64-bit"],
    ),
    ("port out of range", {"spec.engine.port": 70_000}, "spec.engine.port", ["65,535", "70,000"]),
    ("another kind", {"kind": "Deployment"}, "kind", ["ModelDeployment", "'Deployment'"]),
    ("another api version", {"apiVersion": "kvgate.io/v1"}, "apiVersion", ["kvgate.io/v1alpha1"]),
    ("unicode name", {"metadata.name": "модель-8b"}, "metadata.name", ["DNS-1035"]),
    (
        "tensor parallel that does not divide the heads",
        {"spec.decode.tensorParallel": 3},
        "spec.decode.tensorParallel",
        ["3 does not divide the model's 32 attention heads", "set decode.tensorParallel to"],
    ),
    (
        "tensor parallel and KV heads that do not divide one another",
        {
            "spec.prefill.tensorParallel": 16,
            "spec.model.config.num_attention_heads": 48,
            "spec.model.config.num_key_value_heads": 12,
        },
        "spec.prefill.tensorParallel",
        ["16 and the model's 12 KV heads", "do not divide one another"],
    ),
    (
        "GPU memory no GPU has",
        {"spec.prefill.gpuMemoryGiB": 1e25},
        "spec.prefill.gpuMemoryGiB",
        ["at most 16,384", "got 1e+25"],
    ),
    ("name too long for a label", {"metadata.name": "m" * 64}, "metadata.name", ["64", "63"]),
]


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [case[1:] for case in DENIED],
    ids=[case[0] for case in DENIED],
)
def test_unsafe_or_invalid_spec_is_denied_naming_field_and_numbers(
    changes: dict[str, Any], field: str, words: list[str]
) -> None:
    result = check_document(mutated(changes))
    assert not result.allowed
    named = [d for d in result.denials if d.field == field]
    assert named, f"no denial on {field}: {result.message}"
    for word in words:
        assert word in named[0].message, named[0].message


def test_safe_sample_is_allowed_without_warnings() -> None:
    result = check_document(sample_with_weights())
    assert result.allowed
    assert result.denials == ()
    assert result.warnings == ()


EXACT: list[tuple[dict[str, Any], str]] = [
    (
        {"spec.decode.memFractionStatic": 1.0},
        "spec.decode.memFractionStatic: must be < 1 (got 1.0); set a value between 0 and 1, "
        "e.g. 0.85",
    ),
    (
        {"spec.decode.gpuMemoryGiB": 25},
        "spec.decode: estimated KV pool 44,236 tokens < contextLength 131,072 × headroom 1.0"
        " (estimated with gpuReservedGiB 1 from kvgate's assumption, not a measurement: SGLang "
        "subtracts no fixed reserve); "
        "raise decode.gpuMemoryGiB or decode.memFractionStatic, use kvCacheDtype fp8_e4m3, "
        "or lower contextLength; this shape holds at most contextLength 44,236; the smallest "
        "change that holds 131,072: decode.gpuMemoryGiB 40 (estimated pool 148,684 tokens)",
    ),
    (
        {"spec.prefill.maxTotalTokens": 100_000},
        "spec.prefill.maxTotalTokens: 100,000 < contextLength 131,072 × headroom 1.0 = 131,072; "
        "raise prefill.maxTotalTokens to at least 131,072 or remove it",
    ),
    (
        {"spec.engine.image": "lmsysorg/sglang:v0.5.20"},
        "spec.engine.image: lmsysorg/sglang:v0.5.20 is SGLang 0.5.20 < safety.minEngineVersion "
        "0.5.22 (earlier disaggregated SGLang can hand stale KV pages to decode); use an image "
        "at 0.5.22 or later, e.g. lmsysorg/sglang:v0.5.23",
    ),
    (
        {"spec.model.contextLength": 262_144},
        "spec.model.contextLength: 262,144 > 131,072, the context the model's config supports "
        "as SGLang 0.5.23 derives it (it refuses to start); lower contextLength to at most "
        "131,072, or set engine env SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
    ),
]


@pytest.mark.parametrize(("changes", "message"), EXACT)
def test_denial_message_is_exactly_what_the_user_reads(
    changes: dict[str, Any], message: str
) -> None:
    result = check_document(mutated(changes))
    assert result.message == message


def test_fp8_cache_is_not_suggested_when_already_fp8() -> None:
    result = check_document(
        mutated({"spec.decode.gpuMemoryGiB": 19, "spec.engine.kvCacheDtype": "fp8_e4m3"})
    )
    assert not result.allowed
    assert "kvCacheDtype" not in result.message
    assert "decode.gpuMemoryGiB" in result.message


def test_every_problem_is_reported_at_once() -> None:
    result = check_document(
        mutated(
            {
                "spec.engine.image": "lmsysorg/sglang:v0.5.20",
                "spec.decode.gpuMemoryGiB": 25,
                "spec.prefill.maxTotalTokens": 1_000,
            }
        )
    )
    fields = {d.field for d in result.denials}
    assert fields == {"spec.engine.image", "spec.decode", "spec.prefill.maxTotalTokens"}
    assert result.message.startswith("3 problems:\n- ")


def _warning_fields(changes: dict[str, Any]) -> dict[str, str]:
    result = check_document(mutated(changes))
    assert result.allowed, result.message
    return {w.field: w.message for w in result.warnings}


@pytest.mark.parametrize(
    "image", ["lmsysorg/sglang:latest", "lmsysorg/sglang", "lmsysorg/sglang@sha256:" + "a" * 64]
)
def test_image_without_version_is_allowed_with_a_warning(image: str) -> None:
    warnings = _warning_fields({"spec.engine.image": image})
    assert "names no version" in warnings["spec.engine.image"]
    assert "0.5.22" in warnings["spec.engine.image"]


def test_missing_config_is_allowed_with_a_warning_saying_what_is_missing() -> None:
    warnings = _warning_fields({"spec.model.config": DELETE})
    assert "spec.model.config" in warnings["spec"]


def test_missing_gpu_memory_is_allowed_with_a_warning_naming_the_role() -> None:
    warnings = _warning_fields({"spec.decode.gpuMemoryGiB": DELETE})
    assert "spec.decode.gpuMemoryGiB" in warnings["spec"]
    assert "prefill" not in warnings["spec"]


def test_missing_weights_size_falls_back_to_the_config_or_warns() -> None:
    warnings = _warning_fields({"spec.model.weightsGiB": DELETE})
    assert "spec.model.weightsGiB" in warnings["spec"]


def test_margin_under_ten_percent_is_allowed_with_a_warning() -> None:
    warnings = _warning_fields({"spec.decode.gpuMemoryGiB": 38})
    assert "only" in warnings["spec.decode"]
    assert "% above contextLength 131,072" in warnings["spec.decode"]


def test_longer_context_with_the_sglang_override_is_allowed_with_a_warning() -> None:
    env = [{"name": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "value": "1"}]
    warnings = _warning_fields({"spec.model.contextLength": 200_000, "spec.engine.env": env})
    assert "200,000 > 131,072" in warnings["spec.model.contextLength"]


def test_update_that_changes_the_spec_is_checked_like_create() -> None:
    old = sample()
    new = mutated({"spec.decode.gpuMemoryGiB": 25})
    result = check_update(new, old)
    assert not result.allowed
    assert "44,236" in result.message


def test_update_raising_context_length_is_allowed_when_it_fits() -> None:
    env = [{"name": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "value": "1"}]
    new = mutated({"spec.model.contextLength": 200_000, "spec.engine.env": env})
    assert check_update(new, sample()).allowed


def test_update_leaving_a_bad_spec_unchanged_is_allowed_so_it_stays_deletable() -> None:
    old = mutated({"spec.decode.gpuMemoryGiB": 25})
    new = mutated({"metadata.finalizers": []}, base=old)
    result = check_update(new, old)
    assert result.allowed
    assert any("44,236" in w.message and "not enforced" in w.message for w in result.warnings)


@pytest.mark.parametrize("document", [None, [], "text", 42, {"spec": "x"}, {"spec": {}}])
def test_documents_that_are_not_model_deployments_are_denied(document: Any) -> None:
    result = check_document(document)
    assert not result.allowed
    assert result.message


def test_garbage_model_config_warns_instead_of_crashing() -> None:
    result = check_document(
        mutated(
            {
                "spec.model.config": {
                    "max_position_embeddings": 131_072,
                    "num_hidden_layers": "many",
                    "hidden_size": -1,
                }
            }
        )
    )
    assert result.allowed, result.message
    assert any("cannot" in w.message for w in result.warnings)


def test_a_tp_that_does_not_divide_the_heads_is_denied_once_without_an_estimate() -> None:
    """SGLang asserts num_attention_heads % tp_size == 0 at start-up: the engine would crash-loop,
    so the denial is the whole answer for that role (no estimate warning beside it)."""
    result = check_document(mutated({"spec.prefill.tensorParallel": 3}))
    assert [str(d) for d in result.denials] == [
        "spec.prefill.tensorParallel: 3 does not divide the model's 32 attention heads "
        "(spec.model.config num_attention_heads); SGLang asserts num_attention_heads % tp_size "
        "== 0 and the engine does not start; set prefill.tensorParallel to one that divides 32: "
        "1, 2, 4, 8 or 16"
    ]
    assert not [w for w in result.warnings if w.field == "spec.prefill"]


def test_an_architecture_kvgate_does_not_model_is_estimated_with_a_warning() -> None:
    result = check_document(
        mutated({"spec.model.config.architectures": ["FooForCausalLM"]}, sample_with_weights())
    )
    assert result.allowed
    assert [str(w) for w in result.warnings] == [
        "spec.model.config: FooForCausalLM is not an architecture kvgate models; its KV pool "
        "is estimated as standard attention (MHA/GQA: num_key_value_heads × head_dim × "
        "num_hidden_layers), which may be wrong for it; the live engines are verified either way"
    ]


def test_a_kv_dtype_sglang_refuses_is_denied_once_without_an_estimate() -> None:
    result = check_document(mutated({"spec.engine.kvCacheDtype": "float16"}, sample_with_weights()))
    assert [d.field for d in result.denials] == ["spec.engine.kvCacheDtype"]
    assert result.warnings == ()
