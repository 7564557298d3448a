"""Read a live SGLang engine: ``/server_info`` (or ``/get_server_info``) and ``/v1/models``.

``parse_report`` is pure and reads every payload shape SGLang has shipped (0.5.19-0.5.23 and the
older flat shape); ``fetch_report``/``verify`` are the thin HTTP client around it. Neither ever
raises on bad engine output: what cannot be read becomes a problem, and a verdict that cannot be
made is CANNOT_TELL, never SAFE.

Where the numbers come from (SGLang's own keys, stable across releases):

- KV pool: ``internal_states[i].memory_usage.token_capacity``, one per DP rank, minimum taken.
  The ranks are ``dp_size × attn_dp_size``: SGLang 0.5.23 turns ``--dp-size N
  --enable-dp-attention`` into ``attn_dp_size = N, dp_size = 1``
  (sglang/srt/arg_groups/parallel_hook.py ``handle_deprecated_dp_attention``) and runs one
  scheduler per rank of both (``num_dp_ranks_of``, sglang/srt/runtime_context.py); releases
  without ``attn_dp_size`` count attention-DP ranks in ``dp_size``. When no rank reports a pool
  (older engines), the top-level ``max_total_num_tokens``, but only with one rank: with DP that
  number is rank 0's alone.
- ``max_req_input_len``: top level (scheduler handshake, DP rank 0).
- Effective context length, first that is present:
  1. ``/v1/models`` ``data[0].max_model_len`` (the engine's ``model_config.context_len``);
  2. top-level ``context_length``: the ``--context-length`` the engine was started with, which
     SGLang uses as given (it refuses to start when it exceeds the model's own limit);
  3. ``max_req_input_len + 6``: SGLang sets ``max_req_input_len = min(ctx - 1, pool - 1) - 5``,
     so this is ``min(ctx, pool)``, a lower bound of the context, never an overstatement.
- Role: the live ``disaggregation_mode`` of every DP rank's internal state (SGLang writes the
  scheduler's current mode there, sglang/srt/managers/scheduler_components/internal_state.py, so
  it follows a ``--enable-pd-role-switch`` flip); ranks that disagree leave the role unknown. The
  top level (the start-up argument) only when no rank reports one.

SGLang's document carries the engine's secrets (``api_key``, ``admin_api_key``,
``ssl_keyfile_password``, and the same flags in ``launch_command``): it is read only through
``read_server_info``, which redacts them (``kvgate_engine.redact``) and keeps the few fields
checked here, live (``get_json``'s projection) and saved (``kvgate verify --server-info``) alike.

The engine is whoever answers at the pod's address, so nothing it sends is echoed: problems show
numbers, short plain tokens (``"both"``) and otherwise only the kind of value (``a string of 40
characters``); ``version`` is kept only when it looks like a version, the model name only when it
is a short printable name. The HTTP side (``kvgate_engine.untrusted``) follows no redirect, caps
bodies and parse cost, and keeps one deadline per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from kvgate_engine.redact import redact_server_info
from kvgate_engine.report import EngineReport
from kvgate_engine.untrusted import (
    BodyLimits,
    MiB,
    NotFound,
    Unauthorized,
    Unreachable,
    Unreadable,
    get_json,
)
from kvgate_engine.verdict import (
    ENGINE_UNAUTHORIZED,
    ENGINE_UNREACHABLE,
    REPORT_UNREADABLE,
    Requirement,
    Verdict,
    cannot_tell,
    judge,
)

# Ten trillion tokens: no GPU fleet holds that; a bigger number is corruption, not a pool.
MAX_PLAUSIBLE_TOKENS = 10**13
# SGLang 0.5.23's /server_info is ~40 KB for one DP rank: ~800 top-level keys, plus one
# internal_states entry of ~550 keys (~20 KB) per DP rank (measured on SGLang's CPU build). 4 MiB
# holds ~200 DP ranks; 1 MiB would refuse a DP-attention engine of ~50 ranks. /v1/models is one
# short card per served model.
SERVER_INFO_LIMITS = BodyLimits.for_bytes(4 * MiB)
MODELS_LIMITS = BodyLimits.for_bytes(1 * MiB)
ROLES = ("prefill", "decode", "null")
RETRY_BACKOFF_SECONDS = 0.1
# What kvgate keeps of the engine's words: a version (PEP 440-ish, starts with a digit) and a
# printable model name without spaces. Anything else is dropped, never shown.
VERSION_PATTERN = re.compile(r"[0-9][0-9A-Za-z.+!_-]{0,63}")
NAME_PATTERN = re.compile(r"[A-Za-z0-9._:/@+=-]{1,256}")
# A string short and plain enough to quote in a problem ("both", "412345", "auto").
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}")
# Unreadable DP ranks named one by one before the rest are counted.
RANK_PROBLEMS_SHOWN = 3


# ---------------------------------------------------------------------------------------------
# Parsing (pure)
# ---------------------------------------------------------------------------------------------


def _read_tokens(value: object, where: str, problems: list[str]) -> int | None:
    """A token count, or None with a problem for missing, non-numeric, negative or absurd."""
    if value is None:
        problems.append(f"{where} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"{where} is not a number: {_show(value)}")
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            problems.append(f"{where} is not a whole number: {_show(value)}")
            return None
        value = int(value)
    if value < 0:
        problems.append(f"{where} is negative: {_count(value)}")
        return None
    if value > MAX_PLAUSIBLE_TOKENS:
        problems.append(f"{where} is implausibly large: {_count(value)}")
        return None
    return value


def _count(value: int) -> str:
    """``1,234`` for a number of up to 21 digits, else how many digits it has."""
    digits = len(str(abs(value)))
    return f"{value:,}" if digits <= 21 else f"a {digits:,}-digit number"


def _show(value: object) -> str:
    """What the engine sent, described without repeating it: numbers and short plain tokens are
    quoted, anything else is named by its kind."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return _count(value)
    if isinstance(value, float):
        return json.dumps(value)  # NaN, Infinity, 1.5: at most ~24 characters
    if isinstance(value, str):
        if TOKEN_PATTERN.fullmatch(value):
            return json.dumps(value)
        return f"a string of {len(value):,} characters"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, Sequence):
        return "a list"
    return f"a {type(value).__name__}"


def _ranks(server_info: Mapping[str, Any], problems: list[str]) -> tuple[int, ...] | None:
    """Per-DP-rank pools, or None when no rank reports one (caller falls back)."""
    states = server_info.get("internal_states")
    if states is None:
        return None
    if not isinstance(states, Sequence) or isinstance(states, str | bytes):
        problems.append(f"internal_states is not a list: {_show(states)}")
        return None
    reported = [
        isinstance(s, Mapping) and isinstance(s.get("memory_usage"), Mapping) for s in states
    ]
    if not any(reported):
        return None
    pools: list[int] = []
    rank_problems: list[str] = []
    for rank, state in enumerate(states):
        where = f"internal_states[{rank}].memory_usage.token_capacity"
        if not isinstance(state, Mapping) or not isinstance(state.get("memory_usage"), Mapping):
            rank_problems.append(f"internal_states[{rank}] has no memory_usage")
            continue
        tokens = _read_tokens(state["memory_usage"].get("token_capacity"), where, rank_problems)
        if tokens is not None:
            pools.append(tokens)
    if rank_problems:
        # The smallest pool is the one that matters; with one rank unread it is unknown.
        problems.extend(rank_problems[:RANK_PROBLEMS_SHOWN])
        if len(rank_problems) > RANK_PROBLEMS_SHOWN:
            more = len(rank_problems) - RANK_PROBLEMS_SHOWN
            problems.append(f"and {more:,} more DP ranks without a readable token_capacity")
        return ()
    return tuple(pools)


def _width(server_info: Mapping[str, Any], key: str) -> int:
    value = server_info.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return 1


def _dp_ranks(server_info: Mapping[str, Any]) -> int:
    """Schedulers with a KV pool of their own: ``dp_size × attn_dp_size`` (SGLang 0.5.23
    ``num_dp_ranks_of``, sglang/srt/runtime_context.py; older releases have no attn_dp_size)."""
    return _width(server_info, "dp_size") * _width(server_info, "attn_dp_size")


def _ranks_text(server_info: Mapping[str, Any]) -> str:
    dp, attn_dp = _width(server_info, "dp_size"), _width(server_info, "attn_dp_size")
    if attn_dp == 1:
        return f"dp_size is {dp:,}"
    return f"dp_size {dp:,} × attn_dp_size {attn_dp:,} = {dp * attn_dp:,} DP ranks"


def _rank_roles(server_info: Mapping[str, Any]) -> list[tuple[int, object]]:
    states = server_info.get("internal_states")
    if not isinstance(states, Sequence) or isinstance(states, str | bytes):
        return []
    return [
        (rank, state["disaggregation_mode"])
        for rank, state in enumerate(states)
        if isinstance(state, Mapping) and state.get("disaggregation_mode") is not None
    ]


def _role(server_info: Mapping[str, Any], problems: list[str]) -> str | None:
    """The engine's live role: every DP rank's, when they report one and agree."""
    rank_roles = _rank_roles(server_info)
    counts: dict[str, int] = {}
    for _, mode in rank_roles:
        counts[_show(mode)] = counts.get(_show(mode), 0) + 1
    if len(counts) > 1:
        by_mode = ", ".join(f"{shown} on {n:,} rank(s)" for shown, n in sorted(counts.items()))
        problems.append(
            f"DP ranks run different disaggregation_mode ({by_mode}); with "
            "--enable-pd-role-switch the live role is per rank"
        )
        return None
    started_as = server_info.get("disaggregation_mode")
    checked = [("disaggregation_mode", started_as)]
    if rank_roles:
        rank, live = rank_roles[0]
        checked.append((f"internal_states[{rank}].disaggregation_mode", live))
    for where, mode in checked:
        if mode is not None and mode not in ROLES:
            problems.append(f"{where} is not one of prefill, decode, null: {_show(mode)}")
            return None
    mode = rank_roles[0][1] if rank_roles else started_as
    if mode is None:
        problems.append("disaggregation_mode is missing")
        return None
    return str(mode)


def _model_card(models: object, problems: list[str]) -> Mapping[str, Any] | None:
    if models is None:
        return None
    data = models.get("data") if isinstance(models, Mapping) else None
    if not isinstance(data, Sequence) or isinstance(data, str | bytes) or not data:
        problems.append(f"/v1/models has no data[0]: {_show(models)}")
        return None
    card = data[0]
    if not isinstance(card, Mapping):
        problems.append(f"/v1/models data[0] is not an object: {_show(card)}")
        return None
    return card


def parse_report(server_info: object, models: object | None) -> EngineReport:
    """Reduce an engine's ``/server_info`` and ``/v1/models`` payloads to an EngineReport. Pure.

    The document is read only through ``read_server_info``: its secrets redacted, and only the
    fields checked here kept."""
    server_info = read_server_info(server_info)
    problems: list[str] = []
    if not isinstance(server_info, Mapping):
        return EngineReport(
            version=None,
            role=None,
            kv_pool_tokens=None,
            kv_pool_tokens_per_rank=(),
            max_req_input_len=None,
            effective_context_length=None,
            served_model_name=None,
            problems=(f"/server_info is not a JSON object: {_show(server_info)}",),
        )

    version = server_info.get("version")
    if not isinstance(version, str) or not version.strip():
        problems.append(f"version is missing or not a string: {_show(version)}")
        version = None
    elif not VERSION_PATTERN.fullmatch(version):
        problems.append(f"version is not a version string: {_show(version)}")
        version = None

    role = _role(server_info, problems)

    per_rank = _ranks(server_info, problems)
    kv_pool: int | None
    if per_rank is None:
        fallback_problems: list[str] = []
        total = _read_tokens(
            server_info.get("max_total_num_tokens"), "max_total_num_tokens", fallback_problems
        )
        dp = _dp_ranks(server_info)
        if total is not None and dp > 1:
            problems.append(
                f"{_ranks_text(server_info)} but no DP rank reports "
                f"memory_usage.token_capacity; max_total_num_tokens {total:,} covers rank 0 only"
            )
            total = None
        elif total is None:
            problems.append(
                "no KV pool size: internal_states[*].memory_usage.token_capacity absent and "
                + fallback_problems[0]
            )
        kv_pool = total
        per_rank = ()
    elif not per_rank:
        kv_pool = None
    else:
        dp = _dp_ranks(server_info)
        if len(per_rank) < dp:
            problems.append(
                f"{_ranks_text(server_info)} but internal_states reports {len(per_rank)} "
                f"rank(s); the smallest pool is unknown"
            )
            kv_pool = None
        else:
            kv_pool = min(per_rank)

    max_input = _read_tokens(server_info.get("max_req_input_len"), "max_req_input_len", problems)

    card = _model_card(models, problems)
    effective: int | None = None
    if card is not None:
        effective = _read_tokens(card.get("max_model_len"), "/v1/models max_model_len", problems)
    if effective is None and server_info.get("context_length") is not None:
        effective = _read_tokens(server_info.get("context_length"), "context_length", problems)
        if effective == 0:
            effective = None
    if effective is None and max_input is not None:
        # min(context, pool): a lower bound of the context (see the module docstring).
        effective = max_input + 6
    if effective is None:
        problems.append("effective context length: no /v1/models, context_length or fallback")

    name = server_info.get("served_model_name")
    if not isinstance(name, str) and card is not None:
        name = card.get("id")
    served_model_name = name if isinstance(name, str) and NAME_PATTERN.fullmatch(name) else None
    if isinstance(name, str) and served_model_name is None:
        problems.append(f"served model name is not a short printable name: {_show(name)}")

    return EngineReport(
        version=version,
        role=role,
        kv_pool_tokens=kv_pool,
        kv_pool_tokens_per_rank=per_rank,
        max_req_input_len=max_input,
        effective_context_length=effective,
        served_model_name=served_model_name,
        problems=tuple(problems),
    )


# ---------------------------------------------------------------------------------------------
# HTTP client (thin)
# ---------------------------------------------------------------------------------------------


def unauthorized_message(
    error: Exception, api_key: str | None, key_source: str | None = None
) -> str:
    """Why the engine refused the probe, and the way out: where the key comes from, which is
    spec.engine.apiKeySecretRef unless ``key_source`` names another place (a flag)."""
    if key_source is not None:
        if api_key:
            return (
                f"engine refused the API key from {key_source}: {error}; pass the engine's own "
                "--api-key value"
            )
        return f"engine requires an API key: {error}; pass the engine's --api-key with {key_source}"
    if api_key:
        return (
            f"engine refused kvgate's API key: {error}; the key in the Secret named by "
            "spec.engine.apiKeySecretRef is not the engine's --api-key"
        )
    return (
        f"engine requires an API key: {error}; it was started with --api-key, so put the key in a "
        "Secret and set spec.engine.apiKeySecretRef (kvgate passes it to the engine, its probe "
        "and the gateway) instead of --api-key in spec.engine.args"
    )


def _kind_only(value: object) -> object:
    """A scalar as is; a container emptied (its kind still shows in a problem)."""
    if isinstance(value, Mapping):
        return {}
    if isinstance(value, list):
        return []
    return value


def _pick(doc: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {key: _kind_only(doc[key]) for key in keys if key in doc}


_INFO_KEYS = (
    "version",
    "disaggregation_mode",
    "max_total_num_tokens",
    "max_req_input_len",
    "context_length",
    "dp_size",
    "attn_dp_size",
    "served_model_name",
)


def _project_rank(state: object) -> object:
    if not isinstance(state, Mapping):
        return _kind_only(state)
    kept = _pick(state, ("disaggregation_mode",))
    if "memory_usage" in state:
        usage = state["memory_usage"]
        kept["memory_usage"] = (
            _pick(usage, ("token_capacity",)) if isinstance(usage, Mapping) else _kind_only(usage)
        )
    return kept


def project_server_info(doc: object) -> object:
    """The part of a ``/server_info`` document ``parse_report`` reads (same result, a few hundred
    bytes instead of up to megabytes). Pure."""
    if not isinstance(doc, Mapping):
        return _kind_only(doc)
    kept = _pick(doc, _INFO_KEYS)
    if "internal_states" in doc:
        states = doc["internal_states"]
        kept["internal_states"] = (
            [_project_rank(state) for state in states]
            if isinstance(states, list)
            else _kind_only(states)
        )
    return kept


def read_server_info(doc: object) -> object:
    """The one way kvgate reads a ``/server_info`` document, live (the probe, the guard, ``kvgate
    verify --url``) or saved (``kvgate verify --server-info``): every secret it carries redacted
    (``kvgate_engine.redact``: api_key, admin_api_key, ssl_keyfile_password, the flags in
    launch_command, ...), then the fields ``parse_report`` checks kept. Pure."""
    return project_server_info(redact_server_info(doc))


def project_models(doc: object) -> object:
    """The part of a ``/v1/models`` document ``parse_report`` reads. Pure."""
    if not isinstance(doc, Mapping):
        return _kind_only(doc)
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        return {"data": _kind_only(data)} if "data" in doc else {}
    card = data[0]
    first = _pick(card, ("id", "max_model_len")) if isinstance(card, Mapping) else _kind_only(card)
    return {"data": [first]}


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer <key>``, as SGLang's ``--api-key`` middleware checks it
    (sglang/srt/utils/auth.py ``decide_request_auth``: /server_info and /v1/models are NORMAL
    endpoints, open without a key only when the engine has no ``--api-key``)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _get_json(
    session: aiohttp.ClientSession,
    url: str,
    timeout: float,
    retries: int,
    limits: BodyLimits,
    project: Callable[[object], object],
    headers: Mapping[str, str],
) -> object:
    """GET with bounded retries on transport failures and 5xx; 404 and garbage are final."""
    attempt = 0
    while True:
        try:
            return await get_json(
                session, url, timeout=timeout, limits=limits, headers=headers, project=project
            )
        except Unreachable:
            if attempt >= retries:
                raise
        await asyncio.sleep(RETRY_BACKOFF_SECONDS * 2**attempt)
        attempt += 1


async def _server_info(
    session: aiohttp.ClientSession,
    base: str,
    timeout: float,
    retries: int,
    headers: Mapping[str, str],
) -> object:
    limits, project = SERVER_INFO_LIMITS, read_server_info
    try:
        return await _get_json(
            session, f"{base}/server_info", timeout, retries, limits, project, headers
        )
    except NotFound:
        # SGLang releases before /server_info existed only have the deprecated alias.
        try:
            return await _get_json(
                session, f"{base}/get_server_info", timeout, retries, limits, project, headers
            )
        except NotFound as exc:
            raise Unreadable(
                f"{base} has neither /server_info nor /get_server_info (HTTP 404); is it an "
                f"SGLang engine?"
            ) from exc


async def _models(
    session: aiohttp.ClientSession,
    base: str,
    timeout: float,
    retries: int,
    headers: Mapping[str, str],
) -> tuple[object | None, str | None]:
    url = f"{base}/v1/models"
    try:
        models = await _get_json(
            session, url, timeout, retries, MODELS_LIMITS, project_models, headers
        )
        return models, None
    except NotFound:
        return None, f"{url}: HTTP 404"
    except (Unreachable, Unreadable) as exc:
        return None, str(exc)


async def fetch_report(
    base_url: str,
    *,
    timeout: float = 5.0,
    retries: int = 2,
    session: aiohttp.ClientSession | None = None,
    api_key: str | None = None,
    key_source: str | None = None,
) -> EngineReport | Verdict:
    """Read one engine (with ``api_key`` as a Bearer token when it has one). A CANNOT_TELL
    Verdict when it is unreachable or its answer unreadable (``key_source``: where a refused
    key came from, for the message)."""
    base = base_url.rstrip("/")
    owned = session is None
    client = session if session is not None else aiohttp.ClientSession()
    headers = auth_headers(api_key)
    try:
        info_task = asyncio.ensure_future(_server_info(client, base, timeout, retries, headers))
        models_task = asyncio.ensure_future(_models(client, base, timeout, retries, headers))
        try:
            info = await info_task
        except (Unreachable, Unreadable) as exc:
            models_task.cancel()
            await asyncio.gather(models_task, return_exceptions=True)
            if isinstance(exc, Unreachable):
                return cannot_tell(ENGINE_UNREACHABLE, f"engine unreachable: {exc}")
            if isinstance(exc, Unauthorized):
                return cannot_tell(
                    ENGINE_UNAUTHORIZED, unauthorized_message(exc, api_key, key_source)
                )
            return cannot_tell(REPORT_UNREADABLE, f"engine report unreadable: {exc}")
        models, models_problem = await models_task
    except Exception as exc:  # a bad engine must never crash the caller
        # The exception's text may quote what the engine sent: name its class only.
        return cannot_tell(ENGINE_UNREACHABLE, f"engine at {base}: {type(exc).__name__}")
    finally:
        if owned:
            await client.close()
    report = parse_report(info, models)
    if models_problem is not None:
        report = dataclasses.replace(report, problems=(*report.problems, models_problem))
    return report


async def verify(
    base_url: str,
    requirement: Requirement,
    *,
    timeout: float = 5.0,
    retries: int = 2,
    session: aiohttp.ClientSession | None = None,
    api_key: str | None = None,
    key_source: str | None = None,
) -> Verdict:
    """Read one engine and judge it against the requirement."""
    report = await fetch_report(
        base_url,
        timeout=timeout,
        retries=retries,
        session=session,
        api_key=api_key,
        key_source=key_source,
    )
    if isinstance(report, Verdict):
        return report
    return judge(report, requirement)
