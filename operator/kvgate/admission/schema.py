"""Schema checks: the API models' rules (the CRD's rules), as messages a user can act on.

Pydantic says "Input should be less than 1"; a user needs the field, the value they wrote and what
to write instead: ``spec.decode.memFractionStatic: must be < 1 (got 1.0); set a value between 0
and 1, e.g. 0.85``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import types
import typing
from collections.abc import Iterator, Mapping
from datetime import date, datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from kvgate.admission.result import Problem
from kvgate.api.models import MAX_ENGINE_NODES, MAX_GPUS_PER_NODE, ModelDeployment

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# The way out for fields whose constraint alone does not say what a good value looks like.
FIELD_HINTS: dict[str, str] = {
    "memFractionStatic": "set a value between 0 and 1, e.g. 0.85",
    "headroom": "set 1.0 or more (the pool must hold the whole context), e.g. 1.0",
    "replicas": "set 0 or more, e.g. 1",
    "tensorParallel": "set the number of GPUs per engine, 1 or more, e.g. 1",
    "nodes": "set the pods (nodes) per engine, 1 or more, e.g. 1",
    "contextLength": "set the advertised context window in tokens, e.g. 131072",
    "gpuMemoryGiB": "set the memory of one GPU in GiB, e.g. 80, or remove the field",
    "weightsGiB": "set the weight size of one replica in GiB, e.g. 15.0, or remove the field",
    "maxTotalTokens": "set a positive token count, or remove the field",
    "pageSize": "set the KV page size in tokens, 1 or more, e.g. 1",
    "port": "set a port between 1 and 65535",
    "bootstrapPort": "set a port between 1 and 65535, e.g. 8998",
    "minEngineVersion": "set a version such as 0.5.22",
    "image": "set an image such as lmsysorg/sglang:v0.5.23",
    "name": "set a non-empty name",
    "path": "set the model path, e.g. /models/llama-3.1-8b",
    "verifyTimeoutSeconds": "set seconds, 1 or more, e.g. 900",
    "reverifyIntervalSeconds": "set seconds, 1 or more, e.g. 30",
    "minVerifiedPercent": "set a percentage between 1 and 100, e.g. 100",
}

# Fields whose FIELD_HINTS name a range, so they also fit a value above it.
RANGE_HINT_FIELDS = frozenset({"memFractionStatic", "port", "bootstrapPort", "minVerifiedPercent"})
# The way out when a value is above its upper bound, where "set at most N" alone is not enough.
UPPER_HINTS: dict[str, str] = {
    "tensorParallel": f"GPUs per engine across all its nodes, at most {MAX_GPUS_PER_NODE} per "
    f"node on at most {MAX_ENGINE_NODES} nodes",
    "nodes": f"a LeaderWorkerSet group of at most {MAX_ENGINE_NODES} pods per engine",
    "reverifyIntervalSeconds": "re-verification must not pause longer than an hour",
}

_TYPE_NAMES: dict[str, str] = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
}

_COMPARISONS: dict[str, tuple[str, str]] = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def show_value(value: object) -> str:
    """A user's value as it appears in a message: 131,072 / 1.0 / 'fp9' / an object."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) >= 10**30:
            return f"a {len(str(abs(value))):,}-digit number"
        return f"{value:,}"
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return repr(shown)
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def field_path(loc: tuple[int | str, ...]) -> str:
    """('spec', 'engine', 'env', 0, 'name') -> 'spec.engine.env[0].name'."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _unwrap(annotation: Any) -> Any:
    """The model class inside Optional[...], list[...] or dict[str, ...], if any."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                return _unwrap(arg)
    if origin in (list, dict):
        return _unwrap(typing.get_args(annotation)[-1])
    return annotation


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The API model that holds the last element of `loc`."""
    current: Any = ModelDeployment
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        match = next(
            (f for name, f in current.model_fields.items() if part in (f.alias, name)), None
        )
        if match is None:
            return None
        current = _unwrap(match.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def known_fields(loc: tuple[int | str, ...]) -> list[str]:
    """The wire names allowed next to the last element of `loc`."""
    model = _model_at(loc[:-1])
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


# Enum values the schema keeps (so that admission can deny them with the release's own reason)
# but that no supported release accepts: never suggested, with the way out instead.
_ENUM_WITHHELD: dict[str, tuple[tuple[str, ...], str]] = {
    "kvCacheDtype": (
        ("float16",),
        "pick one of them; for a float16 model use auto (no supported SGLang release accepts "
        "float16)",
    ),
}


def _wire_name(loc: tuple[int | str, ...]) -> str:
    """The camelCase name the CRD gives the snake_case key at the end of `loc` (the model's
    alias for a Python field name, else the key camelCased)."""
    name = str(loc[-1])
    model = _model_at(loc[:-1])
    field = model.model_fields.get(name) if model is not None else None
    if field is not None and field.alias:
        return field.alias
    return to_camel(name)  # the API models' own alias generator


def _way_out(name: str, fallback: str) -> str:
    return FIELD_HINTS.get(name, fallback)


def translate(error: ErrorDetails) -> Problem:
    """One pydantic error as a Problem naming the field, the value and the way out."""
    loc = tuple(error["loc"])
    path = field_path(loc)
    name = next((str(p) for p in reversed(loc) if isinstance(p, str)), "")
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = show_value(error.get("input"))

    if kind == "missing":
        return Problem(path, f"required; {_way_out(name, 'add it')}")
    if kind == "extra_forbidden":
        return Problem(path, _unknown_field(loc, name))
    if kind in _COMPARISONS:
        return Problem(path, _out_of_range(kind, ctx.get(_COMPARISONS[kind][0]), name, got))
    if kind in ("too_long", "string_too_long"):
        return Problem(path, _too_long(kind, error, ctx, got))
    if kind == "enum":
        values = re.split(r", | or ", str(ctx.get("expected", "")).replace("'", ""))
        withheld, hint = _ENUM_WITHHELD.get(name, ((), "pick one of them"))
        offered = [value for value in values if value not in withheld]
        listed = ", ".join(offered[:-1]) + f" or {offered[-1]}" if len(offered) > 1 else offered[0]
        return Problem(path, f"must be one of {listed} (got {got}); {hint}")
    if kind in ("string_too_short", "too_short"):
        return Problem(path, f"must not be empty; {_way_out(name, 'set a value')}")
    if kind == "finite_number":
        return Problem(
            path, f"must be a finite number (got {got}); {_way_out(name, 'set a number')}"
        )
    if kind in _TYPE_NAMES:
        expected = _TYPE_NAMES[kind]
        return Problem(
            path, f"must be {expected} (got {got}); {_way_out(name, f'write {expected}')}"
        )
    if kind == "value_error":
        # The API models' own rules, whose messages give the numbers and the way out.
        return Problem(path, str(error["msg"]).removeprefix("Value error, "))
    return Problem(path, f"{error['msg']} (got {got}); {_way_out(name, 'fix the value')}")


def _unknown_field(loc: tuple[int | str, ...], name: str) -> str:
    """A field the API does not have: its camelCase spelling, the closest known one, or them all."""
    known = known_fields(loc)
    camel = _wire_name(loc)
    if camel in known and camel != name:
        # The models also read Python names; the CRD, and so the cluster, only camelCase.
        return f"unknown field; the API spells it {camel} (as the CRD does): rename it"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        way = f"did you mean {close[0]}? rename or remove it"
    else:
        listed = ", ".join(known) if known else "see `kubectl explain modeldeployment`"
        way = f"remove it (known fields here: {listed})"
    return f"unknown field; {way}"


def _out_of_range(kind: str, bound: object, name: str, got: str) -> str:
    """A number beyond a bound, with the bound and, for an upper one, what it comes from."""
    key, symbol = _COMPARISONS[kind]
    limit = f"{bound:g}" if isinstance(bound, float) else show_value(bound)
    if key in ("le", "lt") and name not in RANGE_HINT_FIELDS:
        way = f"set at most {limit}" if key == "le" else f"set a value {symbol} {limit}"
        if name in UPPER_HINTS:
            way += f" ({UPPER_HINTS[name]})"
    else:
        way = _way_out(name, f"set a value {symbol} {limit}")
    return f"must be {symbol} {limit} (got {got}); {way}"


def _too_long(kind: str, error: ErrorDetails, ctx: Mapping[str, Any], got: str) -> str:
    """A list with too many items, or a string with too many characters."""
    bound = ctx.get("max_length")
    value = error.get("input")
    if kind == "too_long":
        actual = ctx.get("actual_length") or (len(value) if hasattr(value, "__len__") else None)
        counted = f"got {actual:,}" if isinstance(actual, int) else f"got {got}"
        return f"at most {show_value(bound)} items ({counted}); remove some"
    length = f"got {len(value):,}" if isinstance(value, str) else f"got {got}"
    return f"at most {show_value(bound)} characters ({length}); shorten it"


def _bad_numbers(
    node: object, loc: tuple[int | str, ...] = ()
) -> Iterator[tuple[tuple[int | str, ...], int | float]]:
    """Integers beyond 64 bits and non-finite floats, with their locations."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict | list | int | float):
                yield from _bad_numbers(value, (*loc, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            if isinstance(value, dict | list | int | float):
                yield from _bad_numbers(value, (*loc, index))
    elif isinstance(node, bool):
        return
    elif isinstance(node, int):
        if not INT64_MIN <= node <= INT64_MAX:
            yield loc, node
    elif isinstance(node, float) and not math.isfinite(node):
        yield loc, node
    elif isinstance(node, Mapping):
        yield from _bad_numbers(dict(node), loc)


def _json_default(value: object) -> object:
    # YAML gives dates and sets; Kubernetes would see them as strings and lists.
    if isinstance(value, date | datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"cannot be represented in JSON: {type(value).__name__}")


def _has_bad_number(node: dict[Any, Any] | list[Any]) -> bool:
    """Whether `_bad_numbers(node)` finds anything: the same rule, in one cheap walk (plain
    JSON types by their exact type; anything else by the rule itself)."""
    for value in node.values() if isinstance(node, dict) else node:
        kind = type(value)
        if kind is str or kind is bool or value is None:
            continue
        if kind is int:
            if not INT64_MIN <= value <= INT64_MAX:
                return True
        elif kind is float:
            if not math.isfinite(value):
                return True
        elif kind is dict or kind is list:
            if _has_bad_number(value):
                return True
        elif isinstance(value, dict | list | int | float) and next(_bad_numbers(value), None):
            return True
    return False


def number_problems(document: Mapping[str, Any]) -> list[Problem]:
    """Numbers JSON and Kubernetes cannot carry: beyond 64 bits, infinities, NaN."""
    if type(document) is dict and not _has_bad_number(document):
        return []  # the common case, found without building locations
    problems = []
    for loc, value in _bad_numbers(document):
        if isinstance(value, int):
            message = (
                f"out of range (got {show_value(value)}); Kubernetes integers are 64-bit, "
                f"between {INT64_MIN:,} and {INT64_MAX:,}"
            )
        else:
            message = f"must be a finite number (got {value!r}); write a number"
        problems.append(Problem(field_path(loc), message))
    return problems


def parse_model(document: Mapping[str, Any]) -> tuple[ModelDeployment | None, list[Problem]]:
    """Validate like the API server: strict types (no "2" for 2), no unknown fields."""
    problems = number_problems(document)
    if problems:
        return None, problems
    try:
        text = json.dumps(document, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as error:
        return None, [Problem("", f"the document is not JSON-representable: {error}")]
    try:
        # by_name=False: the wire names only, as the CRD; a Python name is an unknown field.
        return ModelDeployment.model_validate_json(
            text, strict=True, by_alias=True, by_name=False
        ), []
    except ValidationError as error:
        return None, [translate(e) for e in error.errors(include_url=False)]
