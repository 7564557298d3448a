"""Is this engine safe to take traffic? A pure judgement over an :class:`EngineReport`.

Every check that cannot be made for lack of data makes the verdict CANNOT_TELL; only an engine
that passes every check is SAFE.

The engine's own window is judged from both sides, whatever flags it was started with. Too short
and it refuses what the deployment advertises. Too long and it accepts prompts that no engine of
its revision was proven to hold: every verified engine holds ``context_length`` x headroom
tokens, and nothing more is known of any of them, so an engine whose window (or
``max_req_input_len``) reaches past ``context_length`` could admit a prompt that its own pool, or
the pool of the engine it is paired with, cannot hold. That is the incident's shape (a prefill
that takes a prompt its decode has no room for), and it is caught here rather than trusted to the
flags: keeping each engine's window at ``context_length`` is what makes the pairing safe with a
per-engine judgement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from packaging.version import InvalidVersion, Version

from kvgate_engine.report import EngineReport

INT64_MAX = 2**63 - 1  # spec.model.contextLength is a Kubernetes (64-bit) integer

# The engine version floor when neither the spec nor the cluster sets one: disaggregated SGLang
# before it can hand stale KV pages to decode on an over-length prompt.
DEFAULT_MIN_ENGINE_VERSION = "0.5.22"

# SGLang's max_req_input_len = min(context_len - 1, pool - 1) - 5 (managers/tp_worker.py), so an
# engine whose pool holds the context reports exactly context_len - 6.
MAX_INPUT_MARGIN = 6

KV_POOL_TOO_SMALL = "KvPoolTooSmall"
CONTEXT_TOO_SHORT = "ContextTooShort"
CONTEXT_TOO_LONG = "ContextTooLong"
MAX_INPUT_TOO_SHORT = "MaxInputTooShort"
MAX_INPUT_TOO_LONG = "MaxInputTooLong"
ROLE_MISMATCH = "RoleMismatch"
ENGINE_VERSION_TOO_OLD = "EngineVersionTooOld"
ENGINE_VERSION_UNKNOWN = "EngineVersionUnknown"
ENGINE_UNREACHABLE = "EngineUnreachable"
ENGINE_UNAUTHORIZED = "EngineUnauthorized"
REPORT_UNREADABLE = "ReportUnreadable"
ENGINE_VERIFIED = "EngineVerified"


class Outcome(StrEnum):
    SAFE = "Safe"
    UNSAFE = "Unsafe"
    CANNOT_TELL = "CannotTell"


def required_pool_tokens(context_length: int, headroom: float) -> int | None:
    """ceil(context_length x headroom), the smallest pool that holds the context; None when the
    product is not a finite number (an infinite headroom, or one too large to multiply)."""
    try:
        product = context_length * headroom
    except OverflowError:  # an integer too large for a float
        return None
    return math.ceil(product) if math.isfinite(product) else None


def requirement_problem(
    context_length: int,
    headroom: float,
    *,
    context_name: str = "contextLength",
    headroom_name: str = "headroom",
) -> tuple[str, str] | None:
    """Why no engine can be judged against this requirement: (the name at fault, a message with
    the value and the way out), or None. The names are the caller's (flags or spec fields)."""
    if not 1 <= context_length <= INT64_MAX:
        shown = f"{context_length:,}" if abs(context_length) < 10**30 else "a vast number"
        bound = "1 or more" if context_length < 1 else f"at most {INT64_MAX:,} (64 bits)"
        return context_name, (
            f"must be {bound} (got {shown}); give the advertised context window in tokens, "
            "e.g. 131072"
        )
    if not (math.isfinite(headroom) and headroom >= 1.0):
        return headroom_name, (
            f"must be a finite number >= 1.0 (got {headroom:g}); the pool must hold the context: "
            "1.0 or more, e.g. 1.2"
        )
    if required_pool_tokens(context_length, headroom) is None:
        shown = f"{context_length:,}" if context_length < 10**30 else "a vast number"
        return headroom_name, (
            f"contextLength {shown} × headroom {headroom:g} is too large to compute; lower "
            f"{context_name} or {headroom_name}"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    """What an engine must prove: a pool of context_length x headroom, and the rest."""

    context_length: int
    headroom: float = 1.0
    role: str | None = None
    min_version: str = DEFAULT_MIN_ENGINE_VERSION

    @property
    def required_pool_tokens(self) -> int:
        """ceil(context_length x headroom), the smallest acceptable KV pool (the module's
        required_pool_tokens); OverflowError when the product is not a finite number."""
        required = required_pool_tokens(self.context_length, self.headroom)
        if required is None:
            raise OverflowError(
                f"context length {self.context_length} x headroom {self.headroom:g} is not a "
                "finite number"
            )
        return required


@dataclass(frozen=True)
class Finding:
    reason: str
    message: str


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    findings: tuple[Finding, ...]
    report: EngineReport | None

    @property
    def reason(self) -> str:
        """The first finding's reason, or EngineVerified when safe."""
        return self.findings[0].reason if self.findings else ENGINE_VERIFIED

    @property
    def message(self) -> str:
        if not self.findings:
            return "engine verified"
        return "; ".join(finding.message for finding in self.findings)


def cannot_tell(reason: str, message: str) -> Verdict:
    """A verdict for an engine that could not be read at all."""
    return Verdict(Outcome.CANNOT_TELL, (Finding(reason, message),), None)


def _n(value: int) -> str:
    return f"{value:,}"


def _headroom(value: float) -> str:
    return f"{value:g}" if value != int(value) else f"{value:.1f}"


def judge(report: EngineReport, requirement: Requirement) -> Verdict:
    """Judge one engine report against what the deployment advertises. Pure."""
    unsafe: list[Finding] = []
    unknown: list[Finding] = []
    ctx = requirement.context_length

    required = requirement.required_pool_tokens
    pool = report.kv_pool_tokens
    if pool is None:
        unknown.append(Finding(REPORT_UNREADABLE, "KV pool size not reported"))
    elif pool < required:
        unsafe.append(
            Finding(
                KV_POOL_TOO_SMALL,
                f"KV pool {_n(pool)} tokens < context length {_n(ctx)} × headroom "
                f"{_headroom(requirement.headroom)} (short by {_n(required - pool)} tokens)",
            )
        )

    effective = report.effective_context_length
    if effective is None:
        unknown.append(Finding(REPORT_UNREADABLE, "effective context length not reported"))
    elif effective < ctx:
        unsafe.append(
            Finding(
                CONTEXT_TOO_SHORT,
                f"effective context length {_n(effective)} tokens < context length {_n(ctx)} "
                f"(short by {_n(ctx - effective)} tokens; check --context-length and the "
                f"model's own limit)",
            )
        )
    elif effective > ctx:
        unsafe.append(
            Finding(
                CONTEXT_TOO_LONG,
                f"effective context length {_n(effective)} tokens > context length {_n(ctx)}: "
                f"it would accept prompts of up to {_n(effective)} tokens, but its revision's "
                f"engines are proven to hold only {_n(requirement.required_pool_tokens)} "
                f"(context length × headroom {_headroom(requirement.headroom)}), so one it is "
                f"paired with may not hold them; the engine must run with the --context-length "
                f"{ctx} kvgate passes (admission denies it in spec.engine.args, so another one "
                f"came from the image's entrypoint or command: use an image that adds none)",
            )
        )

    max_input = report.max_req_input_len
    floor = ctx - MAX_INPUT_MARGIN
    if max_input is None:
        unknown.append(Finding(REPORT_UNREADABLE, "max_req_input_len not reported"))
    elif max_input < floor:
        unsafe.append(
            Finding(
                MAX_INPUT_TOO_SHORT,
                f"max_req_input_len {_n(max_input)} tokens < context length {_n(ctx)} − "
                f"{MAX_INPUT_MARGIN} = {_n(floor)} (short by {_n(floor - max_input)} tokens)",
            )
        )
    elif max_input >= ctx:
        unsafe.append(
            Finding(
                MAX_INPUT_TOO_LONG,
                f"max_req_input_len {_n(max_input)} tokens ≥ context length {_n(ctx)}: it "
                f"would accept a prompt that leaves no room in the verified window for a "
                f"single generated token (SGLang reports min(context − 1, pool − 1) − "
                f"{MAX_INPUT_MARGIN - 1}; an engine started with the deployment's context "
                f"reports {_n(floor)})",
            )
        )

    if requirement.role is not None:
        if report.role is None:
            unknown.append(Finding(REPORT_UNREADABLE, "disaggregation_mode not reported"))
        elif report.role != requirement.role:
            unsafe.append(
                Finding(
                    ROLE_MISMATCH,
                    f"engine runs disaggregation_mode {report.role!r}, pod role is "
                    f"{requirement.role!r}",
                )
            )

    version_finding = _check_version(report.version, requirement.min_version)
    if version_finding is not None:
        (unsafe if version_finding.reason == ENGINE_VERSION_TOO_OLD else unknown).append(
            version_finding
        )

    if unsafe:
        return Verdict(Outcome.UNSAFE, tuple(unsafe + unknown), report)
    if unknown:
        # The parser's problems say why a number is missing; they matter only when one is.
        unknown.extend(Finding(REPORT_UNREADABLE, problem) for problem in report.problems)
        return Verdict(Outcome.CANNOT_TELL, _dedupe(unknown), report)
    # Problems that did not cost a check (e.g. /v1/models absent but a fallback worked) stay in
    # report.problems; they do not block a SAFE verdict.
    return Verdict(Outcome.SAFE, (), report)


def _check_version(reported: str | None, floor: str) -> Finding | None:
    try:
        minimum = Version(floor)
    except InvalidVersion:
        return Finding(
            REPORT_UNREADABLE,
            f"minimum engine version {floor!r} is not a PEP 440 version; set e.g. 0.5.22",
        )
    if reported is None:
        return Finding(REPORT_UNREADABLE, "engine version not reported")
    try:
        version = Version(reported)
    except InvalidVersion:
        return Finding(REPORT_UNREADABLE, f"engine version {reported!r} is not a PEP 440 version")
    if is_unreleased_build(version):
        return Finding(
            ENGINE_VERSION_UNKNOWN,
            f"engine version {reported} is a source build without a release number (SGLang "
            f"reports 0.0.0.devN when built outside a release tag, sglang/version.py), so "
            f"whether it is at or above minimum {floor} cannot be told; run a released image "
            f"(e.g. lmsysorg/sglang:v0.5.23) or build from a release tag",
        )
    if version < minimum:
        return Finding(
            ENGINE_VERSION_TOO_OLD,
            f"engine version {reported} < minimum {floor} (use an image at or above "
            f"{floor}, or lower safety.minEngineVersion)",
        )
    return None


def is_unreleased_build(version: Version) -> bool:
    """A version number that says nothing about the code: SGLang's fallback when built without
    package metadata or tags (``0.0.0.dev0``, ``0.0.0.dev1+g<sha>``; sglang/version.py) and
    setuptools-scm's guess for a checkout with no tag reachable (``0.1.devN+g<sha>``). A dev
    build numbered after a real tag (``0.5.24.dev3+g<sha>``) is judged by its number."""
    release = version.release
    major_minor = (*release, 0, 0)[:2]
    return major_minor == (0, 0) or (version.is_devrelease and major_minor == (0, 1))


def _dedupe(findings: list[Finding]) -> tuple[Finding, ...]:
    seen: set[Finding] = set()
    unique: list[Finding] = []
    for finding in findings:
        if finding not in seen:
            seen.add(finding)
            unique.append(finding)
    return tuple(unique)
