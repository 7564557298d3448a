"""What the webhook answers to a well-formed AdmissionReview. Pure: a review in, a response out.

The request has passed `kvgate.admission.review.check_review` (shape, path, resource). CREATE is
checked with `check_document`, UPDATE with `check_update` against `oldObject`; DELETE and CONNECT
(which the ValidatingWebhookConfiguration never sends) and subresources are allowed unchecked,
as kopf's handler filters (operations CREATE and UPDATE, no subresource) did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.admission.checks import check_document, check_update
from kvgate.admission.policy import ClusterPolicy

HANDLER_ID = "validate-modeldeployment"
WEBHOOK_PATH = f"/{HANDLER_ID}"
# 422 Unprocessable Entity, like the API server's own schema failures ("... is invalid").
DENIAL_CODE = 422
INTERNAL_ERROR_CODE = 500

Outcome = Literal["allowed", "denied", "error"]


@dataclass(frozen=True)
class Answer:
    """The AdmissionReview response (`review`) and what it says, for metrics and logs."""

    review: dict[str, Any]
    outcome: Outcome
    operation: str
    message: str = ""


def _request(data: Mapping[str, Any]) -> Mapping[str, Any]:
    request = data.get("request")
    return request if isinstance(request, Mapping) else {}


def _review(
    data: Mapping[str, Any],
    *,
    allowed: bool,
    warnings: list[str],
    code: int | None = None,
    message: str = "",
) -> dict[str, Any]:
    uid = _request(data).get("uid", "")
    response: dict[str, Any] = {"uid": uid if isinstance(uid, str) else "", "allowed": allowed}
    if warnings:
        response["warnings"] = warnings
    if code is not None:
        response["status"] = {"code": code, "message": message}
    return {
        "apiVersion": data.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


def answer_review(data: Mapping[str, Any], policy: ClusterPolicy) -> Answer:
    """Allow or deny the ModelDeployment in the review, with every problem and warning."""
    request = _request(data)
    operation = str(request.get("operation", ""))
    if operation not in ("CREATE", "UPDATE") or request.get("subResource"):
        return Answer(_review(data, allowed=True, warnings=[]), "allowed", operation)
    document = request.get("object")
    if operation == "UPDATE":
        result = check_update(document, request.get("oldObject"), policy)
    else:
        result = check_document(document, policy)
    warnings = [str(warning) for warning in result.warnings]
    if result.allowed:
        return Answer(_review(data, allowed=True, warnings=warnings), "allowed", operation)
    message = result.message
    review = _review(data, allowed=False, warnings=warnings, code=DENIAL_CODE, message=message)
    return Answer(review, "denied", operation, message)


def internal_error(data: Mapping[str, Any], error: BaseException) -> Answer:
    """Deny (never allow what was not checked), saying it is kvgate's fault, not the user's."""
    message = (
        f"kvgate could not check this request ({type(error).__name__}: {error}); this is a "
        "kvgate bug, please report it"
    )
    review = _review(data, allowed=False, warnings=[], code=INTERNAL_ERROR_CODE, message=message)
    operation = _request(data).get("operation", "")
    return Answer(review, "error", operation if isinstance(operation, str) else "", message)
