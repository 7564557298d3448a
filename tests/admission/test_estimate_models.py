"""Admission's pool estimate for today's models: DSA, reserved GPU memory, unmodelled layouts."""

from __future__ import annotations

from factories.admission_reviews import mutated
from factories.model_configs import model_config
from kvgate.admission import check_document

DS32 = model_config("deepseek-v3.2")


def _ds32(changes: dict[str, object]) -> dict[str, object]:
    base = {
        "spec.model.config": DS32,
        "spec.model.weightsGiB": 642,
        "spec.model.contextLength": 131_072,
        "spec.engine.kvCacheDtype": "fp8_e4m3",
    }
    for role in ("prefill", "decode"):
        base |= {
            f"spec.{role}.tensorParallel": 8,
            f"spec.{role}.memFractionStatic": 0.88,
            f"spec.{role}.gpuMemoryGiB": 90,
        }
    return mutated(base | changes)


def test_dsa_model_is_denied_where_sglang_stores_fp8_with_scales_and_an_indexer() -> None:
    """(90 − 1) × 0.88 − 642 / 8 = -1.93 GiB: no room. At 96 GiB: 3.35 GiB / 48,068 bytes
    (fp8 latent + scales + bf16 rope + indexer, × 61) = 74,831 → 74,816 at page 64 < 131,072;
    at 140 GiB the pool holds it."""
    assert not check_document(_ds32({})).allowed
    denied = check_document(_ds32({"spec.decode.gpuMemoryGiB": 96}))
    assert any("74,816" in p.message for p in denied.denials), denied.message
    assert check_document(
        _ds32({"spec.decode.gpuMemoryGiB": 140, "spec.prefill.gpuMemoryGiB": 140})
    ).allowed


def test_gpu_reserved_gib_lowers_the_estimate_before_the_fraction() -> None:
    """Llama-8B at 38 GiB: (38 − 1) × 0.85 − 15 = 16.45 GiB → 134,758 tokens (allowed);
    gpuReservedGiB 3: 14.75 GiB → 120,832 < 131,072 (denied)."""
    assert check_document(mutated({"spec.decode.gpuMemoryGiB": 38})).allowed
    denied = check_document(
        mutated({"spec.decode.gpuMemoryGiB": 38, "spec.decode.gpuReservedGiB": 3})
    )
    assert any("120,832" in p.message for p in denied.denials), denied.message


def test_unmodelled_layout_warns_with_the_reason_and_is_not_guessed() -> None:
    doc = mutated({"spec.engine.args": ["--enable-unified-memory"]})
    result = check_document(doc)
    assert result.allowed
    assert any(
        "cannot estimate the KV pool" in w.message and "--enable-unified-memory" in w.message
        for w in result.warnings
    )


def test_dsa_pool_is_estimated_per_role_from_that_roles_backend() -> None:
    """--dsa-decode-backend trtllm, --dsa-prefill-backend flashmla_kv: the decode engines store
    raw fp8 rows (576 + 132) × 61 = 43,188 bytes, the prefill engines scaled ones, 48,068. At
    96 GiB: 3.35 GiB → decode 83,264 tokens, prefill 74,816 (page 64), each named in its role's
    denial."""
    args = ["--dsa-decode-backend", "trtllm", "--dsa-prefill-backend", "flashmla_kv"]
    denied = check_document(
        _ds32(
            {
                "spec.engine.args": args,
                "spec.decode.gpuMemoryGiB": 96,
                "spec.prefill.gpuMemoryGiB": 96,
            }
        )
    )
    by_field = {p.field: p.message for p in denied.denials}
    decode = next(m for f, m in by_field.items() if f.startswith("spec.decode"))
    prefill = next(m for f, m in by_field.items() if f.startswith("spec.prefill"))
    assert "83,264" in decode, decode
    assert "74,816" in prefill, prefill


def test_a_request_cap_whose_linear_state_fills_the_gpu_is_denied_on_engine_args() -> None:
    """Qwen3-Next at TP 4 on 80 GiB has 29.9 GiB per GPU after the weights; with
    --disable-radix-cache SGLang keeps --max-running-requests 4096 (+1) state slots of
    19,316,736 bytes (73.7 GiB): the denial names engine.args, the numbers and the cap that
    fits, not the weights."""
    roles = {}
    for role in ("prefill", "decode"):
        roles |= {f"spec.{role}.tensorParallel": 4, f"spec.{role}.gpuMemoryGiB": 80}
    doc = mutated(
        {
            "spec.model.config": model_config("qwen3-next-80b-a3b"),
            "spec.model.weightsGiB": 149,
            "spec.engine.args": ["--disable-radix-cache", "--max-running-requests", "4096"],
            **roles,
        }
    )
    denied = check_document(doc)
    messages = [p.message for p in denied.denials if p.field == "spec.engine.args"]
    assert len(messages) == 2, denied.message
    assert "4,097 state slots of 19,316,736 bytes" in messages[0]
    assert "lower --max-running-requests below 1,660" in messages[0]


def test_the_context_limit_is_derived_as_the_images_release_derives_it() -> None:
    """Olmo 3 with a linear rope factor 4 on 4,096 positions: SGLang 0.5.21 (transformers
    5.12.1) derives 16,384; 0.5.23 (transformers 5.19.0, rope per layer type) 4,096, so 16,384
    is denied on v0.5.23 and not on v0.5.21 (the version floor is lowered for the comparison)."""
    olmo3 = {
        "architectures": ["Olmo3ForCausalLM"],
        "model_type": "olmo3",
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    base = {
        "spec.model.config": olmo3,
        "spec.model.contextLength": 16_384,
        "spec.safety.minEngineVersion": "0.5.21",
    }
    old = check_document(mutated(base | {"spec.engine.image": "lmsysorg/sglang:v0.5.21"}))
    assert not [p for p in old.denials if p.field == "spec.model.contextLength"], old.message
    new = check_document(mutated(base | {"spec.engine.image": "lmsysorg/sglang:v0.5.23"}))
    assert any(
        p.field == "spec.model.contextLength"
        and "16,384 > 4,096" in p.message
        and "SGLang 0.5.23" in p.message
        for p in new.denials
    ), new.message


V4_FLASH = model_config("deepseek-v4-flash-base")


def _v4_flash(changes: dict[str, object]) -> dict[str, object]:
    base: dict[str, object] = {
        "spec.model.config": V4_FLASH,
        "spec.model.weightsGiB": 160,
        "spec.model.contextLength": 1_048_576,
        "spec.engine.image": "lmsysorg/sglang:v0.5.23",
    }
    for role in ("prefill", "decode"):
        base |= {
            f"spec.{role}.tensorParallel": 8,
            f"spec.{role}.memFractionStatic": 0.85,
            f"spec.{role}.gpuMemoryGiB": 141,
        }
    return mutated(base | changes)


def _estimate_warnings(document: dict[str, object]) -> dict[str, str]:
    result = check_document(document)
    return {w.field: w.message for w in result.warnings if "cannot estimate" in w.message}


def test_deepseek_v4_is_estimated_with_the_images_release() -> None:
    """DeepSeek-V4-Flash on 4 × 52 GiB decode GPUs under SGLang 0.5.23: (52 − 1) × 0.85 − 160 / 4
    = 3.35 GiB, of which the ratio-128 compress state of 257 request slots takes 2.53 GiB; the
    rest at 7,086.75 bytes a full token holds 124,160 tokens (page 256), below the 1,048,576
    context; on 8 × 141 GiB both roles hold 14,616,576."""
    small = {"spec.decode.tensorParallel": 4, "spec.decode.gpuMemoryGiB": 52}
    denied = check_document(_v4_flash(small))
    decode = next(p.message for p in denied.denials if p.field == "spec.decode")
    assert "estimated KV pool 124,160 tokens" in decode and "fp8_e4m3" not in decode, decode
    assert check_document(_v4_flash({})).allowed
    assert _estimate_warnings(_v4_flash({})) == {}


def test_deepseek_v4_on_an_image_without_a_release_warns_on_the_image() -> None:
    warnings = _estimate_warnings(_v4_flash({"spec.engine.image": "lmsysorg/sglang:latest"}))
    assert list(warnings) == ["spec.engine.image"], warnings
    assert "release is not known" in warnings["spec.engine.image"]
    assert "lmsysorg/sglang:v0.5.23" in warnings["spec.engine.image"]


def test_deepseek_v4_layout_variables_in_the_engine_env_are_not_guessed() -> None:
    layout = [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "auto"}]
    warnings = _estimate_warnings(_v4_flash({"spec.decode.extraEnv": layout}))
    assert list(warnings) == ["spec.engine.env or spec.decode.extraEnv"], warnings
    assert "SGLANG_DSV4_KV_LAYOUT" in next(iter(warnings.values()))
