"""How large a ModelDeployment spec may be. Pure.

Why 96 KiB. Kubernetes caps an object's annotations at 256 KiB in total, and a spec can have two
copies there: client-side `kubectl apply` stores the applied object in
`kubectl.kubernetes.io/last-applied-configuration` (so above ~256 KiB the API server refuses
the apply with "metadata.annotations: Too long"), and kopf stores the spec it last handled in
`kvgate.io/last-handled-configuration` (compact JSON, non-ASCII escaped) as soon as the operator
registers a change handler. Two copies of 96 KiB leave 64 KiB for everything else. The spec's
args, env and placement are also copied into every Deployment, ReplicaSet and pod kvgate builds,
and the operator holds every spec in memory. A real model's config.json, the one part of the
spec that grows, is 1-10 KiB (with a long quantization ignore list, ~30 KiB).

(Measured on the e2e control plane with today's handlers, which register no change handler:
150 KiB applied with kubectl and 600 KiB created with `kubectl create` were reconciled and
served; the limit is headroom by design, not the edge of a failure.)

The CRD cannot express this bound: `model.config` is free-form (preserve-unknown-fields), which
has no size keyword, and CEL cannot measure an object's serialized size. So it lives here, in
the checks the webhook (failurePolicy Fail) and `kvgate validate` share.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

MAX_SPEC_BYTES = 96 * 1024
_GO_PLAIN_FLOAT_LIMIT = 1e21  # Go's encoding/json writes integral floats below this as integers


@functools.cache
def _spec_schema() -> Mapping[str, Any]:
    from kvgate.crd import crd  # late: kvgate.crd imports this package

    schema: Mapping[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


def with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` with the CRD's defaults filled in, as the API server does before admission: a
    missing or null property gets its default, then defaulting continues inside it."""
    if isinstance(value, Mapping) and "properties" in schema:
        out = dict(value)
        for name, sub in schema["properties"].items():
            if out.get(name) is None and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(out[name], sub)
        return out
    if isinstance(value, Mapping) and isinstance(schema.get("additionalProperties"), Mapping):
        return {k: with_defaults(v, schema["additionalProperties"]) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def _as_stored(value: Any) -> Any:
    """Numbers as the API server writes them (1.0 -> 1), so every reader measures alike."""
    if isinstance(value, float) and value.is_integer() and abs(value) < _GO_PLAIN_FLOAT_LIMIT:
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _as_stored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_stored(v) for v in value]
    return value


def _json_size(value: object) -> int:
    """Compact JSON with non-ASCII escaped (how kopf stores it), numbers as the API server's."""
    return len(json.dumps(_as_stored(value), separators=(",", ":"), default=str))


def spec_bytes(spec: object) -> int:
    """The spec's size as the webhook sees it, after the API server's defaulting; `kvgate
    validate` measures the same number from the file."""
    return _json_size(with_defaults(spec, _spec_schema()))


def _kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"


def largest_parts(spec: Mapping[str, Any], limit: int = 2) -> list[tuple[str, int]]:
    """The largest fields one level below spec's sections (`spec.model.config`), largest first."""
    parts: list[tuple[str, int]] = []
    for section, value in spec.items():
        if isinstance(value, Mapping) and value:
            parts += [(f"spec.{section}.{key}", _json_size(sub)) for key, sub in value.items()]
        else:
            parts.append((f"spec.{section}", _json_size(value)))
    return sorted(parts, key=lambda part: -part[1])[:limit]


def size_message(spec: Mapping[str, Any]) -> str | None:
    """Why the spec is too large, with the numbers and the way out; None when it fits."""
    stored = with_defaults(spec, _spec_schema())
    size = _json_size(stored)
    if size <= MAX_SPEC_BYTES:
        return None
    largest = largest_parts(stored)
    shown = [largest[0], *(part for part in largest[1:] if part[1] * 10 >= size)]
    parts = ", ".join(f"{path} {n:,} bytes" for path, n in shown)
    return (
        f"{size:,} bytes ({_kib(size)}) as JSON > {MAX_SPEC_BYTES:,} ({_kib(MAX_SPEC_BYTES)}), "
        "kvgate's limit (a spec must fit twice in the 256 KiB Kubernetes allows an object's "
        f"annotations, where kubectl apply and kopf keep copies of it); largest: {parts}; "
        "shrink them (spec.model.config needs only the keys that size the model: "
        "drop id2label maps, tokenizer data and quantization ignore lists; or remove it, and "
        "admission skips the pool estimate while every live engine is still verified)"
    )
