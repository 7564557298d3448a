"""The content check's abort step (pure): after a request aborted mid-flight, a known-answer
request must still get its known answer.

SGLang's prefill→decode handoff has had decode generate from partial or reused KV after an
abort: the aborted request's pages freed while its KV transfer was still in flight, so the
transfer landed in the pages of the next request, or a decode that took the aborted request's
half-written KV for its successor's. Such an engine answers later requests with HTTP 200 and
wrong tokens, and no length probe sees it. So after the length probes kvgate sends, through the
revision's own router, one after another:

1. a short known-answer request (``KNOWN_PROMPT_TOKENS`` tokens, greedy, ``ignore_eos``): the
   output ids it gets are the known answer;
2. a request about as long as the longest in-range probe (``ABORT_NEW_TOKENS`` new tokens),
   with other token ids, dropped (the connection closed: smg's only cancel) once its head came
   and ``ABORT_FRACTION`` of the time that probe took to be answered passed. Through a router
   that watches its client (the unit tests') the engines abort it mid prefill or mid transfer;
   smg 1.13 passes the disconnect on only when its next write to the client fails, so the
   engines abort it at its first streamed tokens, mid decode;
3. the known-answer request again at once, and once more after the revision's engines hold no
   request: ``settle_seconds`` after the drop at the least (SGLang's tokenizer aborts a streamed
   request whose client went away 2 s after it noticed, ``create_abort_task``), then as soon as
   every verified engine of the revision reports ``sglang:num_running_reqs`` and
   ``sglang:num_queue_reqs`` 0 on its /metrics, within ``IDLE_DEADLINE_SECONDS``. Each must get
   the same output ids.

The engines' own count says whether the drop aborted anything: ``sglang:num_aborted_requests_total``
summed over the revision's engines before the drop and once they are idle. A drop the engines
never counted (the request was over on the engines before the router passed the disconnect on)
exercised no abort path: the step is undecided and the check reruns, never passed on it. Engines
that still hold a request at the deadline leave the last answer undecided too (one that differs
still fails: wrong tokens are wrong whatever the engines report).

Greedy decoding of one prompt on the same engines gives the same tokens, so the first answer is
the known answer without a per-model table. An answer that does not come decides nothing (the
check reruns). A request answered in full before its drop aborted nothing: the one time the
probe took is a noisy guess of how long it runs (on a loaded machine the probe can take over
twice as long as the request, and a decode that lands aborted transfers would pass). So it is
sent again, dropped at half the time its own full answer took (``sooner_drop``), up to
``ABORT_ATTEMPTS`` tries. Answered in full every time, that is recorded and the answers after it
are still compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvgate_engine.request_limits import PLAIN, RequestBounds, longest_full_answer

from kvgate.api.models import ContentProbeSpec
from kvgate.verify.content_probe import (
    Expect,
    ProbeAnswer,
    ProbeFinding,
    ProbeRequest,
    describe_answer,
)

KNOWN_PROMPT_TOKENS = 64  # short: its answer costs one small prefill, twice
ABORT_FRACTION = 0.5  # of the longest in-range probe's measured answer time
# The aborted request asks for more tokens than the probes: a router that passes a client's
# disconnect on only when its next write fails (smg 1.13) must still be relaying tokens then.
ABORT_NEW_TOKENS = 64
MIN_ABORT_SECONDS = 0.05
ABORT_ATTEMPTS = 3  # tries of the dropped request while each is answered in full first
MIN_SETTLE_SECONDS = 2.0  # the least wait from the drop to the last known-answer request
# The longest wait, from the drop, for the engines to report no running or queued request: SGLang
# republishes its gauges of an idle scheduler at least every 30 s (a running count that disagrees
# with its running batch at once; metrics_reporter._maybe_log_idle_metrics), plus a read.
IDLE_DEADLINE_SECONDS = 40.0
IDLE_POLL_SECONDS = 0.25
RUNNING_METRIC = "sglang:num_running_reqs"
QUEUED_METRIC = "sglang:num_queue_reqs"
ABORTED_METRIC = "sglang:num_aborted_requests_total"
ABORT_OFFSET = 1  # the aborted prompt's ids start one place later: no id matches position-wise
MAX_IDS_SHOWN = 12  # output ids quoted in a summary (an engine's answer is untrusted)


@dataclass(frozen=True)
class EngineActivity:
    """One engine pod's requests in flight and aborts so far, from its /metrics."""

    pod: str
    running: int
    queued: int
    aborted: int


@dataclass(frozen=True)
class EngineEvidence:
    """What the revision's engines reported around the drop: their aborts summed before it and
    once idle (None: not read), and how long after the drop they held no request (None: not
    within IDLE_DEADLINE_SECONDS; ``busy`` says what they last reported)."""

    aborted_before: int | None
    aborted_after: int | None
    idle_after: float | None
    busy: str = ""


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """``name{labels} value`` of a Prometheus text line (None: a comment or unparsable)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    name, _, rest = line.partition("{")
    labels: dict[str, str] = {}
    if rest:
        body, _, tail = rest.rpartition("}")
        for part in body.split(","):
            key, _, text = part.partition("=")
            if key:
                labels[key.strip()] = text.strip().strip('"')
    else:
        name, _, tail = line.partition(" ")
    try:
        value = float(tail.split()[0])
    except (IndexError, ValueError):
        return None
    if value != value or value < 0:  # NaN, or no count
        return None
    return name.strip(), labels, value


def activity_from_metrics(pod: str, text: str) -> EngineActivity | None:
    """An engine's running and queued requests (every rank; a per-priority breakdown beside
    the total, ``priority`` not "", is not counted twice) and its aborted requests, from its
    Prometheus text; None when it reports no running requests at all (nothing proves it idle)."""
    sums = {RUNNING_METRIC: 0.0, QUEUED_METRIC: 0.0, ABORTED_METRIC: 0.0}
    seen = False
    for line in text.splitlines():
        sample = _sample(line)
        if sample is None or sample[0] not in sums:
            continue
        name, labels, value = sample
        if name != ABORTED_METRIC and labels.get("priority", ""):
            continue
        sums[name] += value
        seen = seen or name == RUNNING_METRIC
    if not seen:
        return None
    return EngineActivity(
        pod, *(round(sums[m]) for m in (RUNNING_METRIC, QUEUED_METRIC, ABORTED_METRIC))
    )


def busy_engines(activity: Sequence[EngineActivity]) -> str:
    """The engines that hold a request, for a message ("" when none does)."""
    return "; ".join(
        f"{a.pod}: {a.running} running, {a.queued} queued"
        for a in activity
        if a.running or a.queued
    )


def aborted_total(activity: Sequence[EngineActivity] | None) -> int | None:
    return None if activity is None else sum(a.aborted for a in activity)


@dataclass(frozen=True)
class AbortPlan:
    known: ProbeRequest  # sent before and right after the aborted one
    aborted: ProbeRequest  # dropped after ``drop_after`` seconds


@dataclass(frozen=True)
class AbortOutcome:
    """The dropped request: ``dropped_after`` seconds after it was sent, after its head, whose
    status is ``answer.http_status`` (None: it was answered in full first, or nothing came, and
    ``answer`` says which)."""

    answer: ProbeAnswer
    dropped_after: float | None
    # Earlier tries answered in full before their drop: (the drop planned, the answer's seconds).
    missed: tuple[tuple[float, float], ...] = ()


def sooner_drop(drop: float, outcome: AbortOutcome, tries: int) -> float | None:
    """The next try's drop when try number ``tries`` was answered in full before its ``drop``:
    half the time that answer took (the same request on the same engines), and sooner than
    ``drop``. None when it was dropped or got no answer, after ``ABORT_ATTEMPTS`` tries, or when
    no sooner drop is left."""
    answered_first = outcome.dropped_after is None and outcome.answer.http_status is not None
    if not answered_first or tries >= ABORT_ATTEMPTS:
        return None
    sooner = max(MIN_ABORT_SECONDS, ABORT_FRACTION * min(drop, outcome.answer.seconds))
    return sooner if sooner < drop else None


def plan_abort(
    context_length: int,
    verified_pool_tokens: int | None,
    settings: ContentProbeSpec,
    bounds: RequestBounds = PLAIN,
) -> AbortPlan:
    """The abort step of a revision's content check (the length probes' arguments): the
    aborted prompt is the longest in-range probe's share of the longest prompt answered in full
    with ``ABORT_NEW_TOKENS``; the known answer has ``maxNewTokens`` tokens."""
    m = settings.max_new_tokens
    full = longest_full_answer(
        context_length, ABORT_NEW_TOKENS, pool_tokens=verified_pool_tokens, bounds=bounds
    )
    aborted_tokens = max(1, full * max(settings.lengths) // 100)
    known = ProbeRequest(
        "known answer", min(KNOWN_PROMPT_TOKENS, aborted_tokens), m, Expect.KNOWN_ANSWER
    )
    aborted = ProbeRequest(
        "dropped mid-flight", aborted_tokens, ABORT_NEW_TOKENS, Expect.ABORT, offset=ABORT_OFFSET
    )
    return AbortPlan(known, aborted)


def drop_after(longest_answer_seconds: float | None) -> float:
    """When to drop the aborted request: part way into the time the longest in-range probe took
    (mid prefill or mid transfer on the same engines)."""
    return max(MIN_ABORT_SECONDS, ABORT_FRACTION * (longest_answer_seconds or 0.0))


def answer_seconds(findings: Sequence[ProbeFinding]) -> float | None:
    """How long the longest in-range probe took to be answered."""
    answers = [f for f in findings if f.request.expect is Expect.ANSWER]
    if not answers:
        return None
    return max(answers, key=lambda f: f.request.prompt_tokens).answer.seconds


def settle_seconds(drop: float) -> float:
    """How long after the drop the last known-answer request goes: as long as the drop took, and
    at least MIN_SETTLE_SECONDS. smg passes a client's disconnect on only when a write to it
    fails, a token or two later; a request sent before the abort reaches decode gets clean
    tokens even from a decode whose abort path is broken."""
    return max(drop, MIN_SETTLE_SECONDS)


def show_ids(ids: Sequence[int] | None) -> str:
    if ids is None:
        return "no output_ids"
    shown = ", ".join(str(i) for i in ids[:MAX_IDS_SHOWN])
    more = f", … ({len(ids):,} in all)" if len(ids) > MAX_IDS_SHOWN else ""
    return f"output_ids [{shown}{more}]"


def _clean(answer: ProbeAnswer, max_new_tokens: int) -> bool:
    ids = answer.output_ids
    return (
        answer.http_status == 200
        and not answer.error
        and ids is not None
        and len(ids) == max_new_tokens
    )


def _no_answer(answer: ProbeAnswer) -> bool:
    return answer.http_status is None or answer.http_status >= 500


def _before(request: ProbeRequest, answer: ProbeAnswer) -> ProbeFinding:
    head = f"{request.prompt_tokens:,} tokens ({request.name}, before the abort)"
    if _clean(answer, request.max_new_tokens):
        return ProbeFinding(
            request, answer, True, f"{head}: HTTP 200, {show_ids(answer.output_ids)}"
        )
    want = f"want HTTP 200 with {request.max_new_tokens:,} output_ids"
    summary = f"{head}: {describe_answer(answer)}, {show_ids(answer.output_ids)}; {want}"
    return ProbeFinding(request, answer, False, summary, undecided=_no_answer(answer))


def _dropped(request: ProbeRequest, outcome: AbortOutcome, engines: EngineEvidence) -> ProbeFinding:
    head = f"{request.prompt_tokens:,} tokens ({request.name})"
    answer = outcome.answer
    if outcome.dropped_after is None and answer.http_status is None:
        return ProbeFinding(
            request, answer, False, f"{head}: {describe_answer(answer)}", undecided=True
        )
    missed = "; ".join(
        f"try {i}: answered in full in {took:.2f} s, before its drop at {drop:.2f} s"
        for i, (drop, took) in enumerate(outcome.missed, 1)
    )
    earlier = f" ({missed})" if missed else ""
    if outcome.dropped_after is None:
        # Faster than every drop: nothing to abort. The answers after it are still compared;
        # waiting for a drop that never lands would refuse a healthy fast revision at
        # rollout.verifyTimeoutSeconds.
        tries = f" in all {len(outcome.missed) + 1} tries" if outcome.missed else ""
        summary = (
            f"{head}: answered in full before the drop{tries} ({describe_answer(answer)} in "
            f"{answer.seconds:.2f} s), so nothing was aborted{earlier}"
        )
        return ProbeFinding(request, answer, True, summary)
    got = f"after its HTTP {answer.http_status} head"
    summary = f"{head}: connection closed {outcome.dropped_after:.2f} s in, {got}{earlier}"
    before, after = engines.aborted_before, engines.aborted_after
    if before is None or after is None:
        summary += (
            f"; the engines' {ABORTED_METRIC} could not be read, so nothing proves the drop "
            "aborted a request on them"
        )
        return ProbeFinding(request, answer, False, summary, undecided=True)
    if after <= before:
        summary += (
            f"; the engines counted no abort ({ABORTED_METRIC} {before:,} before the drop and "
            f"{after:,} after): they had answered it before the drop reached them, so no abort "
            "path ran"
        )
        return ProbeFinding(request, answer, False, summary, undecided=True)
    count = after - before
    summary += f"; the engines counted {count:,} abort{'s' if count != 1 else ''}"
    return ProbeFinding(request, answer, True, summary)


def _after(
    request: ProbeRequest, when: str, answer: ProbeAnswer, known: ProbeFinding
) -> ProbeFinding:
    head = f"{request.prompt_tokens:,} tokens ({request.name}, {when})"
    want_ids = known.answer.output_ids
    if not known.passed:
        return ProbeFinding(
            request, answer, False, f"{head}: not compared (no known answer)", undecided=True
        )
    if _clean(answer, request.max_new_tokens) and answer.output_ids == want_ids:
        return ProbeFinding(request, answer, True, f"{head}: HTTP 200, the same output_ids")
    summary = (
        f"{head}: {describe_answer(answer)}, {show_ids(answer.output_ids)}; want "
        f"{show_ids(want_ids)} (the answer before the abort)"
    )
    return ProbeFinding(request, answer, False, summary, undecided=_no_answer(answer))


def _settled(finding: ProbeFinding, engines: EngineEvidence) -> ProbeFinding:
    """The last known answer, sent once the engines were idle: undecided when they never were
    (a pass then proves nothing; a failure stands)."""
    if engines.idle_after is not None or not finding.passed:
        return finding
    summary = (
        f"{finding.summary}, but the engines still held a request {IDLE_DEADLINE_SECONDS:g} s "
        f"after the drop ({engines.busy or 'their load unreadable'}): not decided"
    )
    return replace(finding, passed=False, summary=summary, undecided=True)


def judge_abort(
    plan: AbortPlan,
    before: ProbeAnswer,
    outcome: AbortOutcome,
    after: Sequence[tuple[str, ProbeAnswer]],
    engines: EngineEvidence,
) -> tuple[ProbeFinding, ...]:
    """The abort step's findings: the known answer, the dropped request, and each known-answer
    request after the drop (``after``: when it was sent, for people, and its answer; the last one
    sent once the engines were idle), compared only with a clean known answer. A dropped request
    that got no answer at all (not even its head), or whose drop the engines never counted as an
    abort, decides nothing; one answered in full before the drop says so and passes."""
    known = _before(plan.known, before)
    dropped = _dropped(plan.aborted, outcome, engines)
    checked = [_after(plan.known, when, answer, known) for when, answer in after]
    if checked:
        checked[-1] = _settled(checked[-1], engines)
    return (known, dropped, *checked)
