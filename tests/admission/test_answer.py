"""What the webhook answers to a well-formed review (pure): the kopf handler's answers, kept."""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import mutated, review, sample
from kvgate.admission.answer import DENIAL_CODE, INTERNAL_ERROR_CODE, answer_review, internal_error
from kvgate.admission.policy import ClusterPolicy

UNSAFE = mutated({"spec.decode.gpuMemoryGiB": 24})


def _with(body: dict[str, Any], **request: Any) -> dict[str, Any]:
    body["request"].update(request)
    return body


@pytest.mark.parametrize(
    ("body", "allowed", "outcome"),
    [
        (review(sample()), True, "allowed"),
        (review(UNSAFE), False, "denied"),
        (review(UNSAFE, operation="UPDATE", old=sample()), False, "denied"),
        # The same unsafe spec again: an UPDATE that leaves the spec as it was is never blocked.
        (review(UNSAFE, operation="UPDATE", old=UNSAFE), True, "allowed"),
        # Never sent by the ValidatingWebhookConfiguration; allowed unchecked, as kopf did.
        (_with(review(None), operation="DELETE", oldObject=UNSAFE), True, "allowed"),
        (_with(review(UNSAFE), subResource="status"), True, "allowed"),
    ],
    ids=["create", "unsafe create", "unsafe update", "unchanged spec", "delete", "subresource"],
)
def test_each_review_gets_the_answer_the_kopf_handler_gave(
    body: dict[str, Any], allowed: bool, outcome: str
) -> None:
    answer = answer_review(body, ClusterPolicy())
    response = answer.review["response"]
    assert (response["allowed"], answer.outcome) == (allowed, outcome)
    assert response["uid"] == body["request"]["uid"]
    assert answer.review["kind"] == "AdmissionReview"
    if allowed:
        assert "status" not in response
    else:
        assert response["status"] == {"code": DENIAL_CODE, "message": answer.message}
        assert answer.message.startswith("spec.decode: estimated KV pool")


def test_the_answer_has_the_reviews_api_version() -> None:
    body = review(sample())
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    assert answer_review(body, ClusterPolicy()).review["apiVersion"] == "admission.k8s.io/v1beta1"


def test_an_internal_error_denies_with_500_and_says_it_is_a_kvgate_bug() -> None:
    answer = internal_error(review(sample()), KeyError("spec"))
    assert answer.outcome == "error"
    assert answer.review["response"]["allowed"] is False
    assert answer.review["response"]["status"]["code"] == INTERNAL_ERROR_CODE
    assert answer.message == (
        "kvgate could not check this request (KeyError: 'spec'); this is a kvgate bug, please "
        "report it"
    )
