"""Is a webhook request body a well-formed AdmissionReview for one of our webhooks? Pure.

kopf answers HTTP 500 (or crashes inside its handler plumbing) for bodies that are JSON but not an
AdmissionReview, for bytes that are not UTF-8 and for integers beyond Python's 4,300-digit limit,
and it *allows* a review posted to a path with no handler (no handler ran, so nothing failed).
The server runs these checks first, so such a request gets a clear 4xx instead.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

REVIEW_API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
WRITES = ("CREATE", "UPDATE")


class RejectedReview(Exception):
    """A request that is not an admission review we can decide on: an HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_review(body: bytes) -> dict[str, Any]:
    """The JSON body as a dict; RejectedReview(400) for anything that is not a JSON object."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise RejectedReview(
            400, "the body is nested too deeply to be an AdmissionReview"
        ) from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise RejectedReview(400, f"the body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise RejectedReview(
            400, f"the body must be a JSON object (an AdmissionReview), got {type(data).__name__}"
        )
    return data


def _require_mapping(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, Mapping):
        raise RejectedReview(400, f"{where}.{key} must be an object")
    return value


def _require_string(parent: Mapping[str, Any], key: str, where: str) -> str:
    value = parent.get(key)
    if not isinstance(value, str):
        raise RejectedReview(400, f"{where}.{key} must be a string")
    return value


def check_review(
    data: Mapping[str, Any], webhook: str | None, handler_ids: Collection[str]
) -> None:
    """Raise RejectedReview unless `data` is an AdmissionReview posted to a known webhook path."""
    if webhook not in handler_ids:
        known = ", ".join(f"/{handler_id}" for handler_id in sorted(handler_ids))
        raise RejectedReview(404, f"no webhook at /{webhook or ''}; the webhooks here are {known}")
    kind, api_version = data.get("kind"), data.get("apiVersion")
    if kind != "AdmissionReview" or api_version not in REVIEW_API_VERSIONS:
        raise RejectedReview(
            400,
            f"the body must be an AdmissionReview ({' or '.join(REVIEW_API_VERSIONS)}), "
            f"got kind {kind!r} apiVersion {api_version!r}",
        )
    request = _require_mapping(data, "request", "AdmissionReview")
    uid = _require_string(request, "uid", "request")
    if not uid:
        raise RejectedReview(400, "request.uid must not be empty")
    operation = _require_string(request, "operation", "request")
    if operation not in OPERATIONS:
        raise RejectedReview(
            400, f"request.operation must be one of {', '.join(OPERATIONS)}, got {operation!r}"
        )
    resource = _require_mapping(request, "resource", "request")
    for key in ("group", "version", "resource"):
        _require_string(resource, key, "request.resource")
    _require_mapping(request, "userInfo", "request")
    for key in ("object", "oldObject"):
        value = request.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise RejectedReview(400, f"request.{key} must be an object or null")
        if isinstance(value, Mapping) and not isinstance(value.get("metadata", {}), Mapping):
            raise RejectedReview(400, f"request.{key}.metadata must be an object")
    if operation in WRITES and request.get("object") is None:
        raise RejectedReview(400, f"request.object is required for {operation}")
    if request.get("object") is None and request.get("oldObject") is None:
        raise RejectedReview(400, "request.object or request.oldObject is required")


def check_resource(data: Mapping[str, Any], group: str, version: str, plural: str) -> None:
    """Raise RejectedReview(404) unless the review is for `group`/`version` `plural` (call after
    `check_review`): a webhook registered for another resource must not allow it unchecked."""
    resource = data["request"]["resource"]
    got = (resource["group"], resource["version"], resource["resource"])
    if got != (group, version, plural):
        raise RejectedReview(
            404,
            f"no handlers for resource {'/'.join(got)}: this webhook checks "
            f"{group}/{version}/{plural} only; send only those (the "
            "ValidatingWebhookConfiguration's rules)",
        )
