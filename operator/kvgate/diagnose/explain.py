"""``kvgate explain``: why a ModelDeployment is or is not Ready, with the numbers, and the
smallest change that fixes it. Pure: the objects read from the API in, an Explanation out, and
text or JSON from it.

The numbers: the advertised context and headroom from the spec, the live pool of each role from
what only the operator writes after reading the engines (the pods' gate conditions, else the
refusal in the status, else ``status.<role>.minVerifiedKvPoolTokens``). Events are never read for
a number or a finding: anyone who may create Events in the namespace (the built-in ``edit`` role)
can write one with kvgate's reason, wording and reporter. They are listed last, as Events, with
the reporter each one claims. A gate message says
``<role> pod <name> reports KV pool <N> tokens`` (``kvgate.verify.gate.verdict_message``); a test
writes it with that function and reads it back here. The fix: the largest contextLength the live
pools hold (the gate's own arithmetic, ``kvgate_engine.plan.largest_safe_context``), and, when the
spec gives ``model.config`` and ``gpuMemoryGiB``, the planner's smallest single change to the
role's shape (``kvgate_engine.plan.fit_role``, as ``kvgate plan -f`` and admission use it; one on
the GPUs the role has before one on another GPU model), judged against the live pool: when the
engine reports less than the estimate for its shape, a change must hold the requirement at that
same ratio. The estimate takes the reserve per GPU admission takes
(``kvgate.admission.gpu_reserve.resolve_reserve``): the spec's, else the measured reserve for the
role's GPU product (``--gpu-reserve``, else what the operator wrote in
``status.<role>.poolEstimate``), else kvgate's 1 GiB; the change says which.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate_engine.plan import (
    Fix,
    PlanRequest,
    Shape,
    fit_role,
    fix_order,
    largest_safe_context,
    make_plan,
)
from kvgate_engine.plan import required_pool_tokens as _required_pool_tokens

from kvgate.admission.gpu_reserve import (
    GpuReserve,
    reserves_in_status,
    resolve_reserve,
    with_reserve,
)
from kvgate.admission.plan_hint import estimator_options
from kvgate.api import labels
from kvgate.api.models import ModelDeploymentSpec, RoleSpec
from kvgate.api.refusals import Reason, reason

ROLES = ("prefill", "decode")
MAX_EVENTS = 8
# Above the Events, so none reads as kvgate's finding: their writer and reporter are anyone's.
EVENTS_HEADING = (
    "Events on it (not kvgate's record: any client that may create Events writes them, "
    "reporter included):"
)
# Unicode categories never printed as they are from an Event: controls (newline, ESC), formats
# (bidirectional overrides), line and paragraph separators.
UNPRINTED = frozenset({"Cc", "Cf", "Zl", "Zp"})
# What a verdict message says about the pool (kvgate.verify.gate.verdict_message).
POOL_REPORT = re.compile(
    r"\b(?P<role>prefill|decode|engine) pod (?P<pod>\S+) reports KV pool (?P<pool>[\d,]+) tokens"
)

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class PodGate:
    """One engine pod of the spec's revision and its gate."""

    name: str
    role: str
    revision: str | None
    ready: bool
    gate_status: str | None  # "True", "False", or None before the first verdict
    gate_reason: str | None
    gate_message: str
    kv_pool_tokens: int | None  # what its engine reported, when the message says


@dataclass(frozen=True)
class RoleLive:
    """One role's live numbers against the requirement."""

    role: str
    pods: tuple[PodGate, ...]
    kv_pool_tokens: int | None  # the smallest pool its engines reported
    source: str  # where that number was read ("" when none is known)
    context_length: int
    required_pool_tokens: int

    @property
    def holds(self) -> bool | None:
        if self.kv_pool_tokens is None:
            return None
        return self.kv_pool_tokens >= self.required_pool_tokens

    @property
    def short_by_tokens(self) -> int | None:
        if self.kv_pool_tokens is None:
            return None
        return max(0, self.required_pool_tokens - self.kv_pool_tokens)

    @property
    def context_ratio(self) -> float | None:
        """pool ÷ contextLength (the headroom the engine has)."""
        if self.kv_pool_tokens is None:
            return None
        return self.kv_pool_tokens / self.context_length


@dataclass(frozen=True)
class Change:
    """One field changed to one value that holds the requirement."""

    field: str  # the spec path: spec.decode.tensorParallel, spec.model.contextLength
    value: int | float | str
    basis: str  # "live": the gate's arithmetic on the live pool; "estimate": the planner's
    text: str
    kv_pool_tokens: int | None = None  # the pool it is expected to give (estimate basis)


@dataclass(frozen=True)
class EventLine:
    """One Event on the ModelDeployment, as its writer set it (any client may write one)."""

    type: str
    reason: str
    message: str
    count: int
    time: str
    reporter: str | None  # the component (and instance) it names as its source, unverified


@dataclass(frozen=True)
class Explanation:
    name: str
    namespace: str
    ready: bool
    reason: str
    message: str
    generation: int | None
    observed_generation: int | None
    serving_revision: str | None
    target_revision: str | None
    refused_revision: str | None
    refusal: tuple[str, str] | None  # (reason, message) of the spec's revision
    context_length: int | None
    headroom: float | None
    required_pool_tokens: int | None
    roles: tuple[RoleLive, ...]
    changes: tuple[Change, ...]
    advice: tuple[Reason, ...]
    events: tuple[EventLine, ...]
    notes: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# reading the objects
# ---------------------------------------------------------------------------------------------


def _map(value: object) -> Obj:
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _condition(conditions: object, kind: str) -> Obj:
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return {}


def pools_in(message: str) -> list[tuple[str, str, int]]:
    """(role, pod, pool tokens) for each ``<role> pod <name> reports KV pool <N> tokens``."""
    return [
        (m["role"], m["pod"], int(m["pool"].replace(",", "")))
        for m in POOL_REPORT.finditer(message)
    ]


def parse_spec(md: Obj) -> ModelDeploymentSpec | None:
    """The spec as the operator reads it, or None when it does not parse (InvalidSpec)."""
    try:
        return ModelDeploymentSpec.model_validate(md.get("spec"))
    except Exception:  # pydantic's ValidationError, or anything a stored object holds
        return None


def pod_gate(pod: Obj) -> PodGate:
    meta = _map(pod.get("metadata"))
    pod_labels = _map(meta.get("labels"))
    status = _map(pod.get("status"))
    gate = _condition(status.get("conditions"), labels.ENGINE_VERIFIED)
    ready = _condition(status.get("conditions"), "Ready").get("status") == "True"
    message = str(gate.get("message") or "")
    found = pools_in(message)
    return PodGate(
        name=str(meta.get("name") or "?"),
        role=str(pod_labels.get(labels.ROLE) or "engine"),
        revision=_str(pod_labels.get(labels.REVISION)),
        ready=ready,
        gate_status=_str(gate.get("status")),
        gate_reason=_str(gate.get("reason")),
        gate_message=message,
        kv_pool_tokens=found[0][2] if found else None,
    )


def _event_time(event: Obj) -> str:
    series = _map(event.get("series"))
    for value in (
        series.get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        _map(event.get("metadata")).get("creationTimestamp"),
    ):
        if isinstance(value, str) and value:
            return value
    return ""


def one_line(text: str) -> str:
    """``text`` with every control, format and line-separator character escaped (``\\n``,
    ``\\x1b``, ``\\u202e``): an Event's text is its writer's, and a newline, a terminal escape
    or a bidirectional override in it must not print as a line of kvgate's own."""
    return "".join(
        char if unicodedata.category(char) not in UNPRINTED else ascii(char)[1:-1] for char in text
    )


def event_reporter(event: Obj) -> str | None:
    """``<component>[/<instance>]`` the Event names as its source (``reportingComponent`` and
    ``reportingInstance``, else ``source.component`` and ``source.host``): what it claims, which
    its writer chose."""
    source = _map(event.get("source"))
    component = _str(event.get("reportingComponent")) or _str(source.get("component"))
    instance = _str(event.get("reportingInstance")) or _str(source.get("host"))
    if component is None:
        return one_line(instance) if instance else None
    return one_line(f"{component}/{instance}" if instance else component)


def event_lines(events: Sequence[Obj], uid: str | None, name: str | None = None) -> list[EventLine]:
    """The ModelDeployment's Events, newest first (Events of other objects, and of an earlier
    object of the same name, by its uid, are left out)."""
    lines = []
    for event in events:
        involved = _map(event.get("involvedObject"))
        if uid and involved.get("uid") not in (None, uid):
            continue
        if name and involved.get("name") not in (None, name):
            continue
        if involved.get("kind") not in (None, "ModelDeployment"):
            continue
        lines.append(
            EventLine(
                type=one_line(str(event.get("type") or "")),
                reason=one_line(str(event.get("reason") or "")),
                message=one_line(str(event.get("message") or "")),
                count=_int(event.get("count")) or 1,
                time=_event_time(event),
                reporter=event_reporter(event),
            )
        )
    return sorted(lines, key=lambda line: line.time, reverse=True)


# ---------------------------------------------------------------------------------------------
# the numbers
# ---------------------------------------------------------------------------------------------


def _role_live(
    role: str,
    pods: Sequence[PodGate],
    *,
    target: str | None,
    refusal_message: str,
    status: Obj,
    context_length: int,
    required: int,
) -> RoleLive:
    """A role's live pool from what only kvgate writes: the pods' gate conditions (pods/status),
    else the refusal, else the verified minimum (the ModelDeployment's status)."""
    mine = tuple(p for p in pods if p.role == role)
    reported = [p.kv_pool_tokens for p in mine if p.kv_pool_tokens is not None]
    pool, source = (min(reported), "the pods' gate conditions") if reported else (None, "")
    if pool is None and refusal_message:
        found = [n for r, _, n in pools_in(refusal_message) if r == role]
        if found:
            pool, source = min(found), "status.rollout.refusal"
    if pool is None and target and status.get("servingRevision") == target:
        verified = _int(_map(status.get(role)).get("minVerifiedKvPoolTokens"))
        if verified is not None:
            pool, source = verified, f"status.{role}.minVerifiedKvPoolTokens"
    return RoleLive(role, mine, pool, source, context_length, required)


def _role_spec(spec: ModelDeploymentSpec, role: str) -> RoleSpec:
    return spec.prefill if role == "prefill" else spec.decode


def _fix_text(fix: Fix, role: str, expected: int | None, reserve: GpuReserve) -> str:
    value = f"{fix.value:g}" if isinstance(fix.value, float) else str(fix.value)
    if isinstance(fix.value, int):
        value = f"{fix.value:,}"
    about = "" if expected is None else f", about {expected:,} live at the ratio its engines show"
    return (
        f"set spec.{fix.spec_field(role)} to {value} (estimated pool {fix.kv_pool_tokens:,} "
        f"tokens{about}; {reserve.describe()})"
    )


def estimated_changes(
    spec: ModelDeploymentSpec,
    role: str,
    live_pool: int,
    reserves_by_product: Mapping[str, float] | None = None,
) -> list[Change]:
    """The planner's single changes to a role's shape that hold the requirement, judged at the
    ratio of the live pool to the estimate for the current shape (never above 1: an estimate
    lower than the engine's report is kept as it is), with the reserve per GPU admission takes
    (``reserves_by_product``: the cluster's measured reserve by GPU product). Empty when the
    spec gives the planner too little (no model.config or gpuMemoryGiB) or the estimator cannot
    size the model."""
    reserve = resolve_reserve(role, _role_spec(spec, role), reserves_by_product or {})
    role_spec = with_reserve(_role_spec(spec, role), reserve)
    config = spec.model.config
    if config is None or role_spec.gpu_memory_gi_b is None:
        return []
    required = _required_pool_tokens(spec.model.context_length, spec.safety.headroom)
    try:
        planned, ratio = _planned_at_live_ratio(spec, role_spec, role, live_pool, required)
    except Exception:  # a user's config.json can hold anything; the live numbers still stand
        return []
    # On the GPUs the role has first (a setting, more of them), then on another GPU model.
    fixes = sorted(planned.fixes, key=lambda f: (f.new_hardware, fix_order(f)))
    return [_change_of(fix, role, required, ratio, reserve) for fix in fixes]


def _planned_at_live_ratio(
    spec: ModelDeploymentSpec, role_spec: RoleSpec, role: str, live_pool: int, required: int
) -> tuple[Any, float]:
    """The planner's fit of the role, at the ratio of the live pool to the estimate for its
    current shape (never above 1), and that ratio."""
    config = spec.model.config
    assert config is not None and role_spec.gpu_memory_gi_b is not None
    shape = Shape(
        role_spec.gpu_memory_gi_b,
        role_spec.tensor_parallel,
        spec.engine.kv_cache_dtype.value,
        role_spec.mem_fraction_static,
    )
    weights = make_plan(
        PlanRequest(config, weights_gib=spec.model.weights_gi_b, tp=(1,), kv_cache_dtypes=("auto",))
    ).weights_gib

    def fit(context_length: int, headroom: float) -> Any:
        return fit_role(
            config,
            shape,
            weights_gib=weights,
            context_length=context_length,
            headroom=headroom,
            page_size=spec.engine.page_size,
            max_total_tokens=role_spec.max_total_tokens,
            estimator_options=estimator_options(spec, role_spec, role),
        )

    current = fit(spec.model.context_length, spec.safety.headroom)
    estimate = current.kv_pool_tokens
    ratio = min(1.0, live_pool / estimate) if estimate > 0 else 1.0
    return (current if ratio >= 1.0 else fit(math.ceil(required / ratio), 1.0)), ratio


def _change_of(fix: Fix, role: str, required: int, ratio: float, reserve: GpuReserve) -> Change:
    """One planner fix as a change to the spec, with the pool expected at the live ratio."""
    if fix.field == "maxTotalTokens":
        return Change(
            f"spec.{fix.spec_field(role)}",
            required,
            "estimate",
            f"raise spec.{fix.spec_field(role)} to {required:,} or remove it (the cap "
            "is below the requirement)",
        )
    expected = None if ratio >= 1.0 else math.floor(fix.kv_pool_tokens * ratio)
    return Change(
        f"spec.{fix.spec_field(role)}",
        fix.value,
        "estimate",
        _fix_text(fix, role, expected, reserve),
        fix.kv_pool_tokens,
    )


def _context_change(roles: Sequence[RoleLive], headroom: float) -> Change | None:
    known = [r for r in roles if r.kv_pool_tokens is not None]
    if not known or all(r.holds for r in known):
        return None
    value, smallest = min(
        (
            (largest_safe_context(r.kv_pool_tokens or 0, headroom, r.context_length), r)
            for r in known
        ),
        key=lambda pair: pair[0],
    )
    if value <= 0:
        return None
    return Change(
        "spec.model.contextLength",
        value,
        "live",
        f"lower spec.model.contextLength to {value:,} (the most {smallest.role}'s live pool of "
        f"{smallest.kv_pool_tokens:,} tokens holds at headroom {_h(headroom)})",
    )


def _h(headroom: float) -> str:
    return f"{headroom:.1f}" if headroom == int(headroom) else f"{headroom:g}"


# ---------------------------------------------------------------------------------------------
# the explanation
# ---------------------------------------------------------------------------------------------


def _status_notes(
    status: Obj, current: bool, observed: int | None, generation: int | None
) -> list[str]:
    """What the status itself says about the operator: never processed, or behind the spec."""
    if not status:
        return [
            "it has no status: the operator has not processed it; is kvgate running, and does "
            "it watch this namespace (chart value watchNamespaces)?"
        ]
    if not current:
        return [
            f"its status is of generation {observed}, the spec is generation {generation}: the "
            "operator has not processed the latest change yet"
        ]
    return []


def _fixes(
    spec: ModelDeploymentSpec,
    roles: Sequence[RoleLive],
    required: int,
    headroom: float,
    reserves_by_product: Mapping[str, float],
) -> tuple[list[Change], list[str]]:
    """The smallest change per role whose live pool is short (the planner's, by estimate), the
    contextLength the live pools hold, and a note for a short role no single change fixes."""
    changes: list[Change] = []
    notes: list[str] = []
    for live in roles:
        if live.holds is not False or not live.kv_pool_tokens:
            continue
        found = estimated_changes(spec, live.role, live.kv_pool_tokens, reserves_by_product)
        if found:
            changes.append(found[0])  # the smallest; `kvgate plan -f` lists the others
            continue
        need = f"{live.role} needs a pool {required / live.kv_pool_tokens:.2f}× the one it has"
        if spec.model.config is None or _role_spec(spec, live.role).gpu_memory_gi_b is None:
            notes.append(
                f"{need} (more GPU memory per engine, a larger tensorParallel, an fp8 "
                f"kvCacheDtype); with spec.model.config and spec.{live.role}.gpuMemoryGiB "
                "set, kvgate names the shape that holds it"
            )
        else:
            notes.append(
                f"{need}; no single change to its shape holds it by the planner's "
                "estimate (kvgate plan -f lists what each shape holds)"
            )
    context_change = _context_change(roles, headroom)
    if context_change is not None:
        changes.append(context_change)
    return changes, notes


def explain(
    md: Obj,
    pods: Sequence[Obj],
    events: Sequence[Obj],
    reserves_by_product: Mapping[str, float] | None = None,
) -> Explanation:
    """Why ``md`` is or is not Ready, from it, its engine pods and its Events. A shape change is
    estimated with the measured reserves per GPU product the operator wrote in the status
    (status.<role>.poolEstimate), overridden by ``reserves_by_product`` (``--gpu-reserve``)."""
    meta = _map(md.get("metadata"))
    status = _map(md.get("status"))
    reserves = {**reserves_in_status(status), **(reserves_by_product or {})}
    name = str(meta.get("name") or "?")
    generation = _int(meta.get("generation"))
    ready_cond = _condition(status.get("conditions"), "Ready")
    observed = _int(ready_cond.get("observedGeneration")) or _int(status.get("observedGeneration"))
    current = generation is None or observed == generation
    ready = ready_cond.get("status") == "True" and current
    target = _str(status.get("targetRevision"))
    refusal = _refusal_in(status)
    lines = event_lines(events, _str(meta.get("uid")), name)
    notes = _status_notes(status, current, observed, generation)
    target_pods = _target_gates(pods, name, target)
    spec = parse_spec(md)
    roles = _live_roles(spec, status, target_pods, target=target, refusal=refusal)
    context = headroom = required = None
    changes: list[Change] = []
    if spec is not None:
        context, headroom = spec.model.context_length, spec.safety.headroom
        required = _required_pool_tokens(context, headroom)
        if not ready:
            changes, shape_notes = _fixes(spec, roles, required, headroom, reserves)
            notes.extend(shape_notes)
    elif status:
        notes.append("the spec does not parse for this kvgate version (kvgate validate says why)")
    return Explanation(
        name=name,
        namespace=str(meta.get("namespace") or ""),
        ready=ready,
        reason=str(ready_cond.get("reason") or ""),
        message=str(ready_cond.get("message") or status.get("message") or ""),
        generation=generation,
        observed_generation=observed,
        serving_revision=_str(status.get("servingRevision")),
        target_revision=target,
        refused_revision=_str(status.get("refusedRevision")),
        refusal=refusal,
        context_length=context,
        headroom=headroom,
        required_pool_tokens=required,
        roles=tuple(roles),
        changes=tuple(changes),
        advice=_advice(ready, ready_cond, status, refusal, target_pods),
        events=tuple(lines[:MAX_EVENTS]),
        notes=tuple(notes),
    )


def _target_gates(pods: Sequence[Obj], name: str, target: str | None) -> list[PodGate]:
    """The gates of the ModelDeployment's pods of the target revision (all of them: no target)."""
    gates = [
        pod_gate(pod)
        for pod in pods
        if _map(_map(pod.get("metadata")).get("labels")).get(labels.DEPLOYMENT) == name
    ]
    return [g for g in gates if target is None or g.revision == target]


def _refusal_in(status: Obj) -> tuple[str, str] | None:
    """status.rollout.refusal as (reason, message)."""
    refusal = _map(_map(status.get("rollout")).get("refusal"))
    if not refusal.get("reason"):
        return None
    return str(refusal["reason"]), str(refusal.get("message") or "")


def _live_roles(
    spec: ModelDeploymentSpec | None,
    status: Obj,
    target_pods: Sequence[PodGate],
    *,
    target: str | None,
    refusal: tuple[str, str] | None,
) -> list[RoleLive]:
    """Each role's live pool against the requirement (none when the spec does not parse)."""
    if spec is None:
        return []
    context = spec.model.context_length
    required = _required_pool_tokens(context, spec.safety.headroom)
    return [
        _role_live(
            role,
            target_pods,
            target=target,
            refusal_message=refusal[1] if refusal else "",
            status=status,
            context_length=context,
            required=required,
        )
        for role in ROLES
    ]


def _advice(
    ready: bool,
    ready_cond: Obj,
    status: Obj,
    refusal: tuple[str, str] | None,
    pods: Sequence[PodGate],
) -> tuple[Reason, ...]:
    """The catalogue's rows for the reasons behind a not-Ready state, each once."""
    if ready:
        return ()
    wanted = [str(ready_cond.get("reason") or "")]
    if refusal is not None:
        wanted.append(refusal[0])
    degraded = _condition(status.get("conditions"), "Degraded")
    if degraded.get("status") == "True":
        wanted.append(str(degraded.get("reason") or ""))
    wanted += [p.gate_reason or "" for p in pods if p.gate_status != "True"]
    rows: list[Reason] = []
    for name in wanted:
        row = reason(name)
        if row is not None and row.change and row not in rows:
            rows.append(row)
    return tuple(rows)


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------


def _pool_line(live: RoleLive) -> str:
    if live.kv_pool_tokens is None:
        return f"  {live.role:<8} no pool reported yet ({len(live.pods)} pod(s))"
    ratio = live.context_ratio or 0.0
    state = (
        f"holds it ({ratio:.2f}× the context)"
        if live.holds
        else f"short by {live.short_by_tokens:,} ({ratio:.2f}× the context)"
    )
    return f"  {live.role:<8} {live.kv_pool_tokens:,} tokens, {state}; from {live.source}"


def explanation_text(e: Explanation) -> str:
    """What ``kvgate explain`` prints."""
    where = f" in {e.namespace}" if e.namespace else ""
    state = "Ready" if e.ready else "not Ready"
    out = [f"{e.name}{where}: {state}" + (f" ({e.reason})" if e.reason else "")]
    if e.message:
        out.append(f"  {e.message}")
    serving = e.serving_revision or "nothing"
    spec_rev = e.target_revision or "not computed yet"
    if e.refusal is not None:
        spec_rev += f" (refused: {e.refusal[0]})"
    out.append(f"serving: {serving}; the spec's revision: {spec_rev}")
    if e.refusal is not None and e.refusal[1] not in e.message:
        out.append(f"refusal: {e.refusal[1]}")
    if e.context_length is not None and e.headroom is not None and e.required_pool_tokens:
        out.append(
            f"requirement: contextLength {e.context_length:,} × headroom {_h(e.headroom)} = "
            f"{e.required_pool_tokens:,} pool tokens per engine"
        )
    if e.roles:
        out.append(f"live KV pools of revision {e.target_revision or '?'}:")
        out += [_pool_line(live) for live in e.roles]
        for live in e.roles:
            for pod in live.pods:
                if pod.gate_status != "True":
                    gate = pod.gate_reason or "no verdict yet"
                    out.append(f"  pod {pod.name}: gate {pod.gate_status or '-'} {gate}")
    if e.changes:
        # The shape changes hold together (one per role that is short); the context alone.
        shape = [c.text for c in e.changes if c.basis == "estimate"]
        alone = [c.text for c in e.changes if c.basis != "estimate"]
        out.append("smallest change that fixes it:")
        out += [f"  {'and ' if index else ''}{text}" for index, text in enumerate(shape)]
        out += [f"  {'or: ' if shape or index else ''}{text}" for index, text in enumerate(alone)]
    for row in e.advice:
        out.append(f"{row.name}: {row.means}; change: {row.change}")
    out += [f"note: {note}" for note in e.notes]
    if e.events:
        out.append(EVENTS_HEADING)
        for line in e.events:
            count = f" (×{line.count})" if line.count > 1 else ""
            reporter = f"reported as {line.reporter}" if line.reporter else "no reporter named"
            out.append(
                f"  {line.time} {line.type} {line.reason}{count}, {reporter}: {line.message}"
            )
    return "\n".join(out)


def explanation_json(e: Explanation) -> dict[str, Any]:
    """The command's own keys of ``kvgate explain --json``."""
    return {
        "name": e.name,
        "namespace": e.namespace,
        "ready": e.ready,
        "reason": e.reason,
        "message": e.message,
        "generation": e.generation,
        "observed_generation": e.observed_generation,
        "serving_revision": e.serving_revision,
        "target_revision": e.target_revision,
        "refused_revision": e.refused_revision,
        "refusal": None if e.refusal is None else {"reason": e.refusal[0], "message": e.refusal[1]},
        "requirement": {
            "context_length": e.context_length,
            "headroom": e.headroom,
            "required_pool_tokens": e.required_pool_tokens,
        },
        "roles": {live.role: _role_json(live) for live in e.roles},
        "changes": [
            {
                "field": c.field,
                "value": c.value,
                "basis": c.basis,
                "kv_pool_tokens": c.kv_pool_tokens,
                "text": c.text,
            }
            for c in e.changes
        ],
        "advice": [{"reason": r.name, "means": r.means, "change": r.change} for r in e.advice],
        "events": [
            {
                "type": x.type,
                "reason": x.reason,
                "message": x.message,
                "count": x.count,
                "time": x.time,
                "reporter": x.reporter,
            }
            for x in e.events
        ],
        "notes": list(e.notes),
    }


def _role_json(live: RoleLive) -> dict[str, Any]:
    """One role's live pool and its pods' gates in ``kvgate explain --json``."""
    return {
        "kv_pool_tokens": live.kv_pool_tokens,
        "source": live.source,
        "holds": live.holds,
        "short_by_tokens": live.short_by_tokens,
        "pods": [
            {
                "name": p.name,
                "revision": p.revision,
                "ready": p.ready,
                "gate_status": p.gate_status,
                "gate_reason": p.gate_reason,
                "gate_message": p.gate_message,
                "kv_pool_tokens": p.kv_pool_tokens,
            }
            for p in live.pods
        ],
    }


__all__ = [
    "Change",
    "EventLine",
    "Explanation",
    "PodGate",
    "RoleLive",
    "estimated_changes",
    "event_lines",
    "event_reporter",
    "explain",
    "explanation_json",
    "explanation_text",
    "one_line",
    "parse_spec",
    "pod_gate",
    "pools_in",
]
