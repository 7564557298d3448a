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

from kvgate.gen.crd import crd

MAX_SPEC_BYTES = 96 * 1024
# The most the webhook reads of one AdmissionReview (kopf's and aiohttp's limit, kept; a larger
# body is answered 413), and so the most `kvgate validate` and `kvgate plan -f` read of a file.
MAX_REQUEST_BYTES = 1024**2
_GO_PLAIN_FLOAT_LIMIT = 1e21  # Go's encoding/json writes integral floats below this as integers


@functools.cache
def _spec_schema() -> Mapping[str, Any]:
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
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value  # the common leaves first: this runs on every node of every request
    if isinstance(value, float) and value.is_integer() and abs(value) < _GO_PLAIN_FLOAT_LIMIT:
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _as_stored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_stored(v) for v in value]
    return value


class _Defaults:
    """One schema node, reduced to what `with_defaults` reads (built once, walked per request).
    `properties`: (name, has a default, the default, the property's node or None when nothing
    below it has defaults: `with_defaults` returns such a value as it is)."""

    __slots__ = ("additional", "items", "names", "properties")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        properties = schema.get("properties") if "properties" in schema else None
        self.properties = (
            tuple(
                (name, "default" in sub, sub.get("default"), _Defaults.of(sub))
                for name, sub in properties.items()
            )
            if properties is not None
            else None
        )
        self.names = frozenset(properties) if properties is not None else frozenset()
        additional = schema.get("additionalProperties")
        self.additional = _Defaults.of(additional) if isinstance(additional, Mapping) else None
        items = schema.get("items")
        self.items = _Defaults.of(items) if isinstance(items, Mapping) else None

    @staticmethod
    def of(schema: Mapping[str, Any]) -> _Defaults | None:
        node = _Defaults(schema)
        if node.properties is None and node.additional is None and node.items is None:
            return None
        return node


@functools.cache
def _spec_defaults() -> _Defaults:
    return _Defaults(_spec_schema())


def _stored_with_defaults(value: Any, node: _Defaults | None) -> Any:
    """`_as_stored(with_defaults(value, schema))` in one walk: the same value, less work."""
    if node is None:
        return _as_stored(value)
    is_mapping = type(value) is dict or isinstance(value, Mapping)
    if node.properties is not None:
        if not is_mapping:
            return _as_stored(value)
        out = dict(value)
        for name, has_default, default, sub in node.properties:
            if has_default and out.get(name) is None:
                out[name] = default  # rebuilt below: the schema's value is never shared
            if name in out:
                found = out[name]
                kind = type(found)
                if kind is str or kind is int or kind is bool or found is None:
                    continue  # stored as it is
                out[name] = _as_stored(found) if sub is None else _stored_with_defaults(found, sub)
        names = node.names
        # Properties are stored already; `_as_stored` of a stored value is that value.
        return {str(k): (v if k in names else _as_stored(v)) for k, v in out.items()}
    if node.additional is not None and is_mapping:
        additional = node.additional
        return {str(k): _stored_with_defaults(v, additional) for k, v in value.items()}
    if node.items is not None and isinstance(value, list):
        items = node.items
        return [_stored_with_defaults(item, items) for item in value]
    return _as_stored(value)


def _compact_size(stored: object) -> int:
    return len(json.dumps(stored, separators=(",", ":"), default=str))


def _json_size(value: object) -> int:
    """Compact JSON with non-ASCII escaped (how kopf stores it), numbers as the API server's."""
    return _compact_size(_as_stored(value))


def spec_bytes(spec: object) -> int:
    """The spec's size as the webhook sees it, after the API server's defaulting; `kvgate
    validate` measures the same number from the file."""
    return _compact_size(_stored_with_defaults(spec, _spec_defaults()))


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


def _defaults_below(node: _Defaults | None) -> bool:
    if node is None:
        return False
    return (
        any(has_default or _defaults_below(sub) for _, has_default, _, sub in node.properties or ())
        or _defaults_below(node.additional)
        or _defaults_below(node.items)
    )


def _most_added(node: _Defaults | None) -> int | None:
    """The most bytes the defaults under `node` can add to a value's JSON; None when that has no
    bound (a default inside a list item or a map value applies once per element)."""
    if node is None:
        return 0
    if _defaults_below(node.additional) or _defaults_below(node.items):
        return None
    total = 0
    for name, has_default, default, sub in node.properties or ():
        if has_default:  # `"name":<the default, defaulted itself>,` where it was absent
            total += len(json.dumps(name)) + 2 + _compact_size(_stored_with_defaults(default, sub))
        below = _most_added(sub)
        if below is None:
            return None
        total += below
    return total


@functools.cache
def _room_for_defaults() -> int | None:
    return _most_added(_spec_defaults())


def _refuse(value: object) -> object:
    raise TypeError(f"not a JSON type: {type(value).__name__}")


def _fits_for_sure(spec: object) -> bool:
    """A cheap sufficient test for `spec_bytes(spec) <= MAX_SPEC_BYTES`, true for every spec of
    a normal size: the compact JSON of the spec as it came, plus the most the defaults can add,
    is within the limit, and no number in it is written with an exponent (the one case where
    Go's form of a number is longer than Python's: 1e+20 -> 100000000000000000000; in every
    other case the stored form is as long or shorter). Anything but plain JSON types: False."""
    room = _room_for_defaults()
    if room is None:
        return False
    try:
        text = json.dumps(spec, separators=(",", ":"), default=_refuse)
    except (TypeError, ValueError, RecursionError):
        return False
    return len(text) + room <= MAX_SPEC_BYTES and "e+" not in text


def size_message(spec: Mapping[str, Any]) -> str | None:
    """Why the spec is too large, with the numbers and the way out; None when it fits."""
    if _fits_for_sure(spec):
        return None
    stored = _stored_with_defaults(spec, _spec_defaults())
    size = _compact_size(stored)
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
