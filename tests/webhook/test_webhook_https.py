"""The webhook answers AdmissionReview v1 over real HTTPS on loopback, through the server
`kvgate webhook` runs: allowed, denied with code and message, warnings, and bad input refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories.admission_reviews import (
    LiveWebhook,
    mutated,
    post,
    review,
    sample,
    sample_with_weights,
)
from kvgate.admission.answer import DENIAL_CODE


async def test_safe_model_deployment_is_allowed(live_webhook: LiveWebhook) -> None:
    status, answer = await post(live_webhook, review(sample_with_weights()))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "0c3e9b6c-4a7e-4a38-9f44-1f7a2b1d9e01"
    assert answer["response"]["allowed"] is True
    assert "warnings" not in answer["response"]


async def test_a_model_path_nothing_mounts_is_allowed_with_a_warning_kubectl_prints(
    live_webhook: LiveWebhook,
) -> None:
    status, answer = await post(live_webhook, review(sample()))  # /models/..., no source
    assert status == 200
    assert answer["response"]["allowed"] is True
    warnings = [w for w in answer["response"]["warnings"] if w.startswith("spec.model.path: ")]
    assert len(warnings) == 1, answer["response"]["warnings"]
    assert "spec.model.source is not set: nothing is mounted there" in warnings[0]
    assert "Set spec.model.source: persistentVolumeClaim" in warnings[0]


async def test_unsafe_model_deployment_is_denied_with_code_and_numbers(
    live_webhook: LiveWebhook,
) -> None:
    doc = mutated({"spec.decode.gpuMemoryGiB": 25})
    status, answer = await post(live_webhook, review(doc))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == DENIAL_CODE == 422
    assert answer["response"]["status"]["message"] == (
        "spec.decode: estimated KV pool 44,236 tokens < contextLength 131,072 × headroom 1.0"
        " (estimated with gpuReservedGiB 1 from kvgate's assumption, not a measurement: SGLang "
        "subtracts no fixed reserve); "
        "raise decode.gpuMemoryGiB or decode.memFractionStatic, use kvCacheDtype fp8_e4m3, "
        "or lower contextLength; this shape holds at most contextLength 44,236; the smallest "
        "change that holds 131,072: decode.gpuMemoryGiB 40 (estimated pool 148,684 tokens)"
    )


async def test_schema_violation_is_denied_naming_the_field(live_webhook: LiveWebhook) -> None:
    doc = mutated({"spec.decode.memFractionStatic": 1.0, "spec.prefill.replicas": -1})
    _, answer = await post(live_webhook, review(doc))
    message = answer["response"]["status"]["message"]
    assert answer["response"]["allowed"] is False
    assert "spec.decode.memFractionStatic: must be < 1 (got 1.0)" in message
    assert "spec.prefill.replicas: must be >= 0 (got -1)" in message


async def test_warnings_reach_the_user_on_an_allowed_request(live_webhook: LiveWebhook) -> None:
    doc = mutated({"spec.engine.image": "lmsysorg/sglang:latest", "spec.decode.gpuMemoryGiB": 38})
    _, answer = await post(live_webhook, review(doc))
    assert answer["response"]["allowed"] is True
    warnings = answer["response"]["warnings"]
    assert any(w.startswith("spec.engine.image: lmsysorg/sglang:latest names no") for w in warnings)
    assert any(
        w.startswith("spec.decode: estimated KV pool 134,758 tokens is only") for w in warnings
    )


async def test_update_is_checked_like_create(live_webhook: LiveWebhook) -> None:
    new = mutated({"spec.engine.image": "lmsysorg/sglang:v0.5.19"})
    _, answer = await post(live_webhook, review(new, operation="UPDATE", old=sample()))
    assert answer["response"]["allowed"] is False
    assert "0.5.19 < safety.minEngineVersion 0.5.22" in answer["response"]["status"]["message"]


async def test_update_of_metadata_only_is_not_blocked(live_webhook: LiveWebhook) -> None:
    old = mutated({"spec.decode.gpuMemoryGiB": 25})
    new = mutated({"metadata.finalizers": []}, base=old)
    _, answer = await post(live_webhook, review(new, operation="UPDATE", old=old))
    assert answer["response"]["allowed"] is True
    assert any("not enforced" in w for w in answer["response"]["warnings"])


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"spec.model.contextLength": 2**70}, "64-bit"),
        ({"spec.decode.replicas": 10**40}, "spec.decode.replicas: out of range"),
        ({"metadata.name": "модель-🚀"}, "metadata.name: must be a DNS-1035 label"),
        ({"spec.model.name": "模型" * 10_000}, "as JSON > 98,304"),
        ({"kind": "Deployment"}, "kind: must be ModelDeployment"),
    ],
    ids=["huge context", "huge replicas", "unicode name", "huge unicode model name", "other kind"],
)
async def test_odd_objects_get_a_denial_with_a_message(
    live_webhook: LiveWebhook, changes: dict[str, Any], words: str
) -> None:
    doc = mutated({"spec.decode.gpuMemoryGiB": 25, **changes})
    status, answer = await post(live_webhook, review(doc))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert words in answer["response"]["status"]["message"]


def _review_without(key: str) -> dict[str, Any]:
    body = review(sample())
    del body["request"][key]
    return body


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe\x00garbage", 400, "not valid JSON"),
        (b"[1, 2, 3]", 400, "must be a JSON object"),
        (b'{"n": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
        (b'{"n": NaN}', 400, "not valid JSON"),
        (b"[" * 100_000, 400, "nested too deeply"),
        (json.dumps({"hello": "world"}).encode(), 400, "must be an AdmissionReview"),
        (
            json.dumps({**review(sample()), "request": "x"}).encode(),
            400,
            "request must be an object",
        ),
        (json.dumps(_review_without("userInfo")).encode(), 400, "request.userInfo"),
        (json.dumps(_review_without("uid")).encode(), 400, "request.uid"),
        (json.dumps(_review_without("object")).encode(), 400, "request.object is required"),
        (json.dumps(review([1, 2])).encode(), 400, "request.object must be an object"),
        (json.dumps(review({"metadata": "x"})).encode(), 400, "metadata must be an object"),
    ],
    ids=[
        "malformed json",
        "not utf-8",
        "json array",
        "5000-digit integer",
        "NaN literal",
        "deep nesting",
        "not an admission review",
        "request not an object",
        "no userInfo",
        "no uid",
        "create without object",
        "object is a list",
        "metadata is a string",
    ],
)
async def test_bad_requests_get_a_clear_4xx(
    live_webhook: LiveWebhook, body: bytes, status: int, words: str
) -> None:
    got_status, answer = await post(live_webhook, body, raw=True)
    assert got_status == status
    assert words in answer["error"]


async def test_review_for_another_resource_is_refused_not_allowed(
    live_webhook: LiveWebhook,
) -> None:
    status, answer = await post(live_webhook, review(sample(), resource="pods"))
    assert status == 404
    assert "no handlers" in answer["error"]


@pytest.mark.parametrize("path", ["/", "/validate-something-else", "/validate-modeldeployment/x"])
async def test_review_posted_to_a_path_without_a_handler_is_refused_not_allowed(
    live_webhook: LiveWebhook, path: str
) -> None:
    status, answer = await post(live_webhook, review(sample()), url=live_webhook.base_url + path)
    assert status == 404
    assert "/validate-modeldeployment" in answer["error"]


async def test_body_over_the_size_limit_is_refused(live_webhook: LiveWebhook) -> None:
    doc = mutated({"spec.model.name": "x" * 3 * 1024 * 1024})
    status, _ = await post(live_webhook, review(doc))
    assert status == 413
