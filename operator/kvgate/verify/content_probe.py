"""The content check at maximum length (pure): which probe requests to send, and whether the
answers prove that a revision serves what it advertises.

The pool check compares two numbers an engine reports. It cannot see an engine that *says* its
limits are right but lets an over-length prompt through (a patched build, a wrong flag, a
regression in admission): the incident's signature was HTTP 200 with generated tokens for a prompt
the engine could not hold. So before a new revision takes traffic, kvgate sends, through that
revision's own router:

- in-range prompts at ``lengths`` percent of the longest prompt SGLang answers in full, which must
  each be answered with HTTP 200 and exactly ``maxNewTokens`` generated tokens, without an error;
- a prompt just over the verified KV pool and one just over ``contextLength`` (one prompt when
  they are the same length), which must be refused: HTTP 4xx, or an in-band error in the stream
  before any token. Never HTTP 200 with generated tokens;
- when all of those passed, the abort step (:mod:`kvgate.verify.abort_probe`): a known-answer
  request must still get its answer after a request was dropped mid-flight.

The longest prompt answered in full comes from SGLang's own bounds
(:mod:`kvgate_engine.request_limits`): the tokenizer adds speculative decoding's reserved tokens
to the input, the scheduler admits ``n < min(contextLength, pool) − 6``, grants at most
``min(contextLength, pool) − n − 2`` new tokens, and clips them to the pool less the paged input
and one page. With a pool as large as the context, page 1 and no speculative decoding, a full
answer of ``m`` tokens needs ``n <= contextLength - m - 2`` and ``n <= contextLength - 7``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvgate_engine.estimator import EstimateError, forced_page_size
from kvgate_engine.request_limits import (
    PLAIN,
    RequestBounds,
    longest_full_answer,
    speculative_reserved_tokens,
)

from kvgate.api.models import ContentProbeSpec, ModelDeploymentSpec

REASON_FAILED = "ContentCheckFailed"
REASON_PASSED = "ContentCheckPassed"
# Some probe got no answer or a 5xx and none failed for sure: nothing is recorded, the check
# runs again (RETRY_SECONDS later) until it decides or rollout.verifyTimeoutSeconds refuses.
REASON_INCONCLUSIVE = "ContentCheckInconclusive"
RETRY_SECONDS = 15.0
MAX_ERROR_CHARS = 160  # of an engine's error text kept in status (it is untrusted input)
MAX_RECORDS = 10  # status.contentChecks (the API's maxItems)


class Expect(StrEnum):
    ANSWER = "Answer"  # HTTP 200 with exactly max_new_tokens tokens, no error
    REFUSAL = "Refusal"  # HTTP 4xx, or an in-band error before any token
    KNOWN_ANSWER = "KnownAnswer"  # HTTP 200 with the same tokens as before an abort (abort_probe)
    ABORT = "Abort"  # a request the check drops mid-flight (abort_probe)


@dataclass(frozen=True)
class ProbeRequest:
    """One probe: a prompt of ``prompt_tokens`` tokens asking for ``max_new_tokens``; its token
    ids start ``offset`` places into the probes' sequence (``prompt_ids``)."""

    name: str  # what the length is, for people: "50% of the longest full answer"
    prompt_tokens: int
    max_new_tokens: int
    expect: Expect
    offset: int = 0


@dataclass(frozen=True)
class ProbeAnswer:
    """What came back through the router.

    ``http_status`` is None when nothing came back (connection refused, reset, deadline);
    ``transport_error`` then says which. ``generated_tokens`` counts the tokens the client
    received (a stream's last cumulative count). ``error`` is an error the body or the stream
    carried, shortened (an engine's text is untrusted: kvgate keeps only a prefix).
    """

    http_status: int | None
    generated_tokens: int = 0
    error: str | None = None
    transport_error: str | None = None
    seconds: float = 0.0
    output_ids: tuple[int, ...] | None = None  # the generated ids, when the answer carried them


@dataclass(frozen=True)
class ProbeFinding:
    request: ProbeRequest
    answer: ProbeAnswer
    passed: bool
    summary: str  # "131,073 tokens (over contextLength): HTTP 200, 8 tokens generated"
    undecided: bool = False  # not passed, and it proves nothing either way: the check reruns


@dataclass(frozen=True)
class ContentVerdict:
    passed: bool
    reason: str  # ContentCheckPassed | ContentCheckFailed | ContentCheckInconclusive
    message: str
    findings: tuple[ProbeFinding, ...]

    @property
    def conclusive(self) -> bool:
        return self.reason != REASON_INCONCLUSIVE


def _inconclusive(finding: ProbeFinding) -> bool:
    """No answer, or a server error: says nothing about the engine's length admission."""
    status = finding.answer.http_status
    return not finding.passed and (finding.undecided or status is None or status >= 500)


def contaminated(finding: ProbeFinding) -> bool:
    """A known-answer request after an aborted one came back with other tokens (HTTP 200)."""
    return (
        finding.request.expect is Expect.KNOWN_ANSWER
        and not finding.passed
        and not finding.undecided
        and finding.answer.http_status == 200
        and not finding.answer.error
    )


def bounds_of(spec: ModelDeploymentSpec) -> RequestBounds:
    """The page the engines run with (spec.engine.pageSize, or the page SGLang forces for the
    model, whichever is the larger multiple) and speculative decoding's reserved tokens."""
    page = spec.engine.page_size
    config = spec.model.config
    if config:
        # a config the estimator cannot sort keeps the page the spec asks for
        with contextlib.suppress(EstimateError):
            page = math.lcm(page, forced_page_size(config))
    return RequestBounds(page, speculative_reserved_tokens(spec.engine.args, config))


def plan_probes(
    context_length: int,
    verified_pool_tokens: int | None,
    settings: ContentProbeSpec,
    bounds: RequestBounds = PLAIN,
) -> tuple[ProbeRequest, ...]:
    """The probes for a revision whose smallest verified KV pool is ``verified_pool_tokens``
    (None: not known; then only the over-context probe is over range, and the in-range probes
    assume a pool as large as the context). ``bounds``: the engine's page and speculative
    reserved tokens, which shorten the longest prompt answered in full."""
    m = settings.max_new_tokens
    full = longest_full_answer(context_length, m, pool_tokens=verified_pool_tokens, bounds=bounds)
    probes: list[ProbeRequest] = []
    seen: set[int] = set()
    for percent in sorted(set(settings.lengths)):
        n = max(1, full * percent // 100)
        if n in seen:
            continue
        seen.add(n)
        probes.append(ProbeRequest(f"{percent}% of the longest full answer", n, m, Expect.ANSWER))
    over_context = context_length + 1
    if verified_pool_tokens is not None and verified_pool_tokens + 1 > over_context:
        probes.append(
            ProbeRequest(
                f"over the verified KV pool of {verified_pool_tokens:,} tokens",
                verified_pool_tokens + 1,
                m,
                Expect.REFUSAL,
            )
        )
    probes.append(
        ProbeRequest(f"over contextLength {context_length:,}", over_context, m, Expect.REFUSAL)
    )
    return tuple(probes)


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_ERROR_CHARS else flat[: MAX_ERROR_CHARS - 1] + "…"


def describe_answer(answer: ProbeAnswer) -> str:
    if answer.http_status is None:
        return f"no answer ({answer.transport_error or 'unknown error'})"
    text = f"HTTP {answer.http_status}, {answer.generated_tokens:,} tokens generated"
    if answer.error:
        text += f", error {_clip(answer.error)!r}"
    return text


def judge(request: ProbeRequest, answer: ProbeAnswer) -> ProbeFinding:
    """Whether one answer is what a safe engine gives to this probe."""
    head = f"{request.prompt_tokens:,} tokens ({request.name})"
    got = describe_answer(answer)
    status = answer.http_status
    if request.expect is Expect.ANSWER:
        passed = (
            status == 200 and answer.generated_tokens == request.max_new_tokens and not answer.error
        )
        want = f"want HTTP 200 with {request.max_new_tokens:,} tokens"
    else:
        refused_by_status = status is not None and 400 <= status < 500
        refused_in_band = status == 200 and answer.generated_tokens == 0 and bool(answer.error)
        # HTTP 200 with tokens is the incident's signature; a 5xx or no answer is not a
        # refusal either: it proves nothing about admission (and smg retries 5xx).
        passed = refused_by_status or refused_in_band
        want = "want a refusal (HTTP 4xx or an in-band error, never 200 with tokens)"
    summary = f"{head}: {got}" if passed else f"{head}: {got}; {want}"
    return ProbeFinding(request, answer, passed, summary)


def verdict(revision: str, findings: Sequence[ProbeFinding]) -> ContentVerdict:
    """The revision's content check from its probes' findings."""
    failed = [f for f in findings if not f.passed]
    if not findings:
        return ContentVerdict(
            False, REASON_INCONCLUSIVE, f"content check of revision {revision}: no probe ran", ()
        )
    if failed and all(_inconclusive(f) for f in failed):
        message = (
            f"content check of revision {revision} could not decide, retrying in "
            f"{RETRY_SECONDS:g} s: " + "; ".join(f.summary for f in failed)
        )
        return ContentVerdict(False, REASON_INCONCLUSIVE, message, tuple(findings))
    if failed:
        leak = any(
            f.request.expect is Expect.REFUSAL
            and f.answer.http_status == 200
            and f.answer.generated_tokens > 0
            for f in failed
        )
        if leak:
            lead = (
                "an over-length prompt was answered with generated tokens (HTTP 200), the "
                "incident's signature"
            )
        elif any(contaminated(f) for f in failed):
            lead = (
                "abort-path contamination: after a request was aborted mid-flight, the same "
                "known-answer request got other tokens (decode ran on partial or reused KV)"
            )
        else:
            lead = f"{len(failed)} of {len(findings)} probes failed"
        fix = (
            "Serve an engine build whose aborted requests release their KV cleanly"
            if any(contaminated(f) for f in failed) and not leak
            else "Fix the engine's length admission"
        )
        message = (
            f"content check of revision {revision} failed: {lead}: "
            + "; ".join(f.summary for f in failed)
            + f". {fix} (or set safety.contentProbe.enabled=false to skip this check), then "
            "change the spec to retry"
        )
        return ContentVerdict(False, REASON_FAILED, message, tuple(findings))
    message = f"content check of revision {revision} passed: " + "; ".join(
        f.summary for f in findings
    )
    return ContentVerdict(True, REASON_PASSED, message, tuple(findings))


# Probe token ids without a known vocabulary: [1,000, 31,000), inside the vocabularies of the
# models people serve (32,000 and up), clear of special tokens (below 1,000 or at the top).
DEFAULT_ID_RANGE = (1000, 31_000)


def vocab_size_of(config: Mapping[str, Any] | None) -> int | None:
    """``vocab_size`` of a model's config.json (multimodal configs nest it in ``text_config``),
    or None when the config does not give a positive integer."""
    if not config:
        return None
    text = config.get("text_config")
    value = (text if isinstance(text, Mapping) else config).get("vocab_size")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def id_range(vocab_size: int | None) -> tuple[int, int]:
    """[lo, hi) of the probe's token ids. An id at or above the model's vocabulary is not a
    refusal test but an engine crash: SGLang 0.5.23 looks it up in the embedding unchecked
    (``IndexError: index out of range`` in the scheduler on CPU, a device-side assert on a GPU),
    and the whole engine dies. So a vocabulary smaller than the default range gets ids from its
    middle: above its first quarter (special and byte tokens) and below its last eighth."""
    lo, hi = DEFAULT_ID_RANGE
    if vocab_size is None or vocab_size >= hi:
        return lo, hi
    lo, hi = vocab_size // 4, vocab_size - vocab_size // 8
    return lo, max(hi, lo + 1)


def prompt_ids(count: int, vocab_size: int | None = None, offset: int = 0) -> list[int]:
    """A deterministic prompt of ``count`` ordinary token ids of a vocabulary of ``vocab_size``
    (None: unknown; ``id_range``), starting ``offset`` places into the sequence."""
    lo, hi = id_range(vocab_size)
    span = hi - lo
    return [lo + ((i + offset) * 7919) % span for i in range(count)]


# ------------------------------------------------------------------ the record in status
@dataclass(frozen=True)
class ContentCheck:
    """A revision's recorded content check (``status.contentChecks[]``; only kvgate writes it)."""

    revision: str
    passed: bool
    message: str


def record_of(revision: str, result: ContentVerdict, checked_at: str) -> dict[str, Any]:
    """The ``status.contentChecks[]`` item for one check (camelCase, as the API has it)."""
    return {
        "revision": revision,
        "passed": result.passed,
        "checkedAt": checked_at,
        "message": result.message,
        "probes": [
            {
                "name": f.request.name,
                "promptTokens": f.request.prompt_tokens,
                "maxNewTokens": f.request.max_new_tokens,
                "expect": f.request.expect.value,
                "httpStatus": f.answer.http_status,
                "generatedTokens": f.answer.generated_tokens,
                "error": _clip(f.answer.error or f.answer.transport_error),
                "passed": f.passed,
            }
            for f in result.findings
        ],
    }


def checks_in(status: Mapping[str, Any] | None) -> tuple[ContentCheck, ...]:
    """The recorded checks; malformed items are skipped (a check that is not there reruns)."""
    out = []
    for item in (status or {}).get("contentChecks") or []:
        if (
            isinstance(item, Mapping)
            and isinstance(item.get("revision"), str)
            and isinstance(item.get("passed"), bool)
        ):
            out.append(ContentCheck(item["revision"], item["passed"], str(item.get("message", ""))))
    return tuple(out)


def updated_records(
    previous: Mapping[str, Any] | None, new: Mapping[str, Any] | None, keep: Iterable[str]
) -> list[dict[str, Any]]:
    """``status.contentChecks`` after this pass: ``new`` replaces its revision's record, and
    records of revisions no longer running are dropped (newest first, at most MAX_RECORDS)."""
    keep_set = set(keep)
    records: list[dict[str, Any]] = [dict(new)] if new is not None else []
    for item in (previous or {}).get("contentChecks") or []:
        if not isinstance(item, Mapping):
            continue
        revision = item.get("revision")
        if revision in keep_set and all(r["revision"] != revision for r in records):
            records.append(dict(item))
    return records[:MAX_RECORDS]
