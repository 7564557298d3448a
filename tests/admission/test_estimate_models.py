"""Admission's pool estimate for today's models: DSA, reserved GPU memory, unmodelled layouts."""

from __future__ import annotations

from factories.model_configs import model_config
from kvgate.admission import check_document

from .conftest import mutated

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
