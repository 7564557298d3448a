"""The PATCH content types of the Kubernetes API, as plain names the pure planners can use."""

from __future__ import annotations

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
