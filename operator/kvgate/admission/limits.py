"""How large a ModelDeployment spec may be. Pure.

Why 96 KiB: Kubernetes caps an object's annotations at 256 KiB in total, and two annotations
each hold a copy of the spec — `kubectl apply` stores the applied object in
`kubectl.kubernetes.io/last-applied-configuration`, and kopf stores the spec it last handled in
`kvgate.io/last-handled-configuration` when it runs change handlers (compact JSON, non-ASCII
escaped). Two copies of 96 KiB leave 64 KiB for everything else. A real model's config.json, the
one part of the spec that grows, is 1–10 KiB (with a long quantization ignore list, ~30 KiB).

The CRD cannot express this bound: `model.config` is free-form (preserve-unknown-fields), which
has no size keyword, and CEL cannot measure an object's serialized size. So it lives here, in
the checks the webhook (failurePolicy Fail) and `kvgate validate` share.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_SPEC_BYTES = 96 * 1024


def spec_bytes(spec: object) -> int:
    """The spec's size as compact JSON with non-ASCII escaped (how kopf stores it)."""
    return len(json.dumps(spec, separators=(",", ":"), default=str))


def _kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"


def largest_parts(spec: Mapping[str, Any], limit: int = 2) -> list[tuple[str, int]]:
    """The largest fields one level below spec's sections (`spec.model.config`), largest first."""
    parts: list[tuple[str, int]] = []
    for section, value in spec.items():
        if isinstance(value, Mapping) and value:
            parts += [(f"spec.{section}.{key}", spec_bytes(sub)) for key, sub in value.items()]
        else:
            parts.append((f"spec.{section}", spec_bytes(value)))
    return sorted(parts, key=lambda part: -part[1])[:limit]


def size_message(spec: Mapping[str, Any]) -> str | None:
    """Why the spec is too large, with the numbers and the way out; None when it fits."""
    size = spec_bytes(spec)
    if size <= MAX_SPEC_BYTES:
        return None
    parts = ", ".join(f"{path} {n:,} bytes" for path, n in largest_parts(spec))
    return (
        f"{size:,} bytes ({_kib(size)}) as JSON > {MAX_SPEC_BYTES:,} ({_kib(MAX_SPEC_BYTES)}), "
        f"the most kvgate can store and reconcile (Kubernetes caps an object's annotations at "
        f"256 KiB, and kubectl and the operator each keep a copy of the spec there); largest: "
        f"{parts}; shrink them (spec.model.config needs only the keys that size the model: "
        "drop id2label maps, tokenizer data and quantization ignore lists; or remove it, and "
        "admission skips the pool estimate while every live engine is still verified)"
    )
