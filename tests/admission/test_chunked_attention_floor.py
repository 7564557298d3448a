"""Admission of Llama 4 (chunked attention): its chunked pool's floor is a denial with the numbers.

The expected pool is the one SGLang 0.5.19 and 0.5.23 computed and refused for this shape
(tests/fixtures/sglang_pools/llama4.json, "maverick-bf16-tp8-h200-mfs0.666-floor").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from factories.admission_reviews import mutated
from factories.model_configs import model_config
from kvgate.admission import check_document

RECORD = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "sglang_pools" / "llama4.json").read_text()
)
FLOOR = next(s for s in RECORD["shapes"] if s["name"] == "maverick-bf16-tp8-h200-mfs0.666-floor")
SIZED = next(s for s in RECORD["shapes"] if s["name"] == "maverick-tp8-h200")


def _maverick(shape: dict[str, Any], context_length: int) -> dict[str, Any]:
    changes: dict[str, Any] = {
        "spec.model.config": model_config(shape["model"]),
        "spec.model.weightsGiB": shape["weights"],
        "spec.model.contextLength": context_length,
        "spec.engine.pageSize": shape["page"],
    }
    for role in ("prefill", "decode"):
        changes |= {
            f"spec.{role}.tensorParallel": shape["tp"],
            f"spec.{role}.gpuMemoryGiB": shape["gpu"],
            f"spec.{role}.gpuReservedGiB": shape["reserved"],
            f"spec.{role}.memFractionStatic": shape["mfs"],
        }
    return mutated(changes)


def test_llama4_whose_chunked_pool_sglang_refuses_is_denied_with_the_numbers_and_the_way_out() -> (
    None
):
    """The weights fit (0.11 GiB a GPU is left, a full pool of ~5,900 tokens above the 4,096
    context), but the chunked pool is 4,672 tokens ≤ chunk 8,192 + page 64: SGLang refuses to
    start, so admission denies each role, naming the pool, the chunk, the page and the fields."""
    result = check_document(_maverick(FLOOR, 4_096))
    assert not result.allowed
    swa_tokens = int(FLOOR["refused"].split("(")[1].split(" ")[0])
    by_field = {p.field: p.message for p in result.denials}
    for role in ("prefill", "decode"):
        message = by_field[f"spec.{role}"]
        assert f"{swa_tokens:,} tokens" in message and "8,192" in message, message
        assert "attention_chunk_size" in message and "page 64" in message, message
        assert "weights leave no room" not in message, message
        assert f"{role}.memFractionStatic" in message and "--swa-full-tokens-ratio" in message


def test_llama4_with_room_for_its_chunked_pool_is_admitted() -> None:
    """The same model with fp8 weights (390 GiB) at 0.85: SGLang's pool of 3,610,905 tokens
    holds a 1,048,576-token context."""
    assert SIZED["max_total_num_tokens"] >= 1_048_576
    result = check_document(_maverick({**SIZED, "page": 64}, 1_048_576))
    assert result.allowed, result.message
