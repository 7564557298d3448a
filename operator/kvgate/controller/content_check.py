"""Send a revision's content-check probes through its own router (I/O around content_probe).

The router is one of the revision's router pods whose controller chain proves it is the
ModelDeployment's (a look-alike pod never gets the probes, nor the engine API key). Each probe is
one streamed ``POST /generate`` with ``input_ids`` and ``ignore_eos``, read like any untrusted
answer: one deadline, a byte cap, only the status, the token count and a shortened error kept.
Probes run one after another, so a 1 M-token check costs one prefill at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from kvgate_engine.untrusted import read_bounded

from kvgate.api import labels
from kvgate.api.models import ModelDeployment, ModelDeploymentSpec
from kvgate.api.timestamps import rfc3339
from kvgate.controller.engine_pods import engine_api_key
from kvgate.controller.gateway_watch import router_url
from kvgate.controller.identity import resolve_identity
from kvgate.controller.runtime import MdKey, Runtime, spawn
from kvgate.kube import metrics
from kvgate.objects import router_auth
from kvgate.rollout.pass_decision import ContentOutcome
from kvgate.rollout.planner import RolloutStep
from kvgate.verify import abort_probe, content_probe, gate, pod_identity
from kvgate.verify.abort_probe import AbortOutcome, EngineActivity, EngineEvidence
from kvgate.verify.content_probe import ContentVerdict, ProbeAnswer, ProbeFinding, ProbeRequest
from kvgate.verify.pod_identity import EngineIdentity

log = logging.getLogger("kvgate.content_check")
CONNECT_SECONDS = 10.0  # to open the connection to the router, within the probe's deadline
MAX_ANSWER_BYTES = 1 << 20  # a probe asks for at most 1,024 tokens; more is not an answer


def parse_stream(status: int, raw: bytes, truncated: bool, seconds: float) -> ProbeAnswer:
    """A streamed (or, on an error, plain JSON) ``/generate`` answer -> what the judge needs.

    Tokens: the largest ``meta_info.completion_tokens`` or ``len(output_ids)`` any event carried
    (SGLang streams cumulative counts); ``output_ids``: a plain (not streamed) answer's. Errors:
    ``{"error": ...}`` events or bodies, and a ``finish_reason`` of type ``abort``. Pure.
    """
    text = raw.decode(errors="replace")
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line.removeprefix("data:").strip()
            if payload == "[DONE]":
                break
            try:
                events.append(json.loads(payload))
            except ValueError:
                events.append({"error": "unparseable stream event"})
    plain = not events  # one JSON answer, not a stream
    if not events and text.strip():
        try:
            events.append(json.loads(text))
        except ValueError:
            events.append({"error": text} if status != 200 else {"error": "unparseable answer"})
    tokens = 0
    output_ids: tuple[int, ...] | None = None
    error: str | None = "answer cut at 1 MiB" if truncated else None
    for event in events:
        for item in event if isinstance(event, list) else [event]:
            if not isinstance(item, Mapping):
                continue
            if "error" in item:
                err = item["error"]
                message = err.get("message") if isinstance(err, Mapping) else err
                error = error or str(message)
            meta = item.get("meta_info") if isinstance(item.get("meta_info"), Mapping) else {}
            count = meta.get("completion_tokens") if isinstance(meta, Mapping) else None
            if isinstance(count, int):
                tokens = max(tokens, count)
            ids = item.get("output_ids")
            if isinstance(ids, list):
                tokens = max(tokens, len(ids))
                if plain and all(isinstance(i, int) for i in ids):
                    output_ids = tuple(ids)
            finish = meta.get("finish_reason") if isinstance(meta, Mapping) else None
            if isinstance(finish, Mapping) and finish.get("type") == "abort":
                error = error or str(finish.get("message") or "aborted")
    if status != 200 and error is None:
        error = f"HTTP {status}"
    return ProbeAnswer(status, tokens, error, None, seconds, output_ids)


def _body(
    model: str, request: ProbeRequest, vocab_size: int | None, stream: bool
) -> dict[str, Any]:
    return {
        "model": model,
        "input_ids": content_probe.prompt_ids(request.prompt_tokens, vocab_size, request.offset),
        "sampling_params": {
            "max_new_tokens": request.max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
        "stream": stream,
    }


def _deadline(timeout: float) -> aiohttp.ClientTimeout:
    # A router that does not accept the connection is inconclusive in seconds; an answer may
    # take the whole deadline (a long prefill streams nothing before it).
    return aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, CONNECT_SECONDS))


def _post_generate(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    request: ProbeRequest,
    *,
    timeout: float,
    headers: Mapping[str, str] | None,
    vocab_size: int | None,
    stream: bool,
) -> Any:
    """The probe's ``POST /generate`` through the router (an ``async with`` request)."""
    return session.post(
        f"{base_url}/generate",
        json=_body(model, request, vocab_size, stream),
        headers=dict(headers or {}),
        allow_redirects=False,
        timeout=_deadline(timeout),
    )


def _failure(exc: BaseException, started: float) -> str:
    what = "deadline" if isinstance(exc, TimeoutError) else type(exc).__name__
    return f"{what} after {time.monotonic() - started:.1f} s"


async def send_probe(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    request: ProbeRequest,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    vocab_size: int | None = None,
    stream: bool = True,
) -> ProbeAnswer:
    """One probe through the router (token ids inside ``vocab_size``); never raises."""
    started = time.monotonic()
    try:
        async with _post_generate(
            session,
            base_url,
            model,
            request,
            timeout=timeout,
            headers=headers,
            vocab_size=vocab_size,
            stream=stream,
        ) as response:
            raw = await read_bounded(response.content, MAX_ANSWER_BYTES + 1)
            truncated = len(raw) > MAX_ANSWER_BYTES
            return parse_stream(
                response.status, raw[:MAX_ANSWER_BYTES], truncated, time.monotonic() - started
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        return ProbeAnswer(None, transport_error=_failure(exc, started))


async def send_dropped(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    request: ProbeRequest,
    *,
    drop_after: float,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    vocab_size: int | None = None,
) -> AbortOutcome:
    """A streamed request whose connection is closed once its head came and ``drop_after``
    seconds passed since it was sent: the abort a client's disconnect is, smg's only cancel (the
    head first: by then both engines hold the request). Never raises."""
    started = time.monotonic()
    try:
        async with _post_generate(
            session,
            base_url,
            model,
            request,
            timeout=timeout,
            headers=headers,
            vocab_size=vocab_size,
            stream=True,
        ) as response:
            left = max(0.0, drop_after - (time.monotonic() - started))
            try:
                raw = await asyncio.wait_for(
                    read_bounded(response.content, MAX_ANSWER_BYTES + 1), left
                )
            except TimeoutError:
                response.close()  # not back to the pool: the router sees the disconnect
                dropped = time.monotonic() - started
                return AbortOutcome(ProbeAnswer(response.status, seconds=dropped), dropped)
            truncated = len(raw) > MAX_ANSWER_BYTES
            answer = parse_stream(
                response.status, raw[:MAX_ANSWER_BYTES], truncated, time.monotonic() - started
            )
            return AbortOutcome(answer, None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return AbortOutcome(ProbeAnswer(None, transport_error=_failure(exc, started)), None)


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


async def revision_router(
    rt: Runtime, namespace: str, md_name: str, md_uid: str | None, revision: str
) -> tuple[dict[str, Any], str] | None:
    """A Ready router pod of the revision, proven the ModelDeployment's, and its URL."""
    for _, pod in rt.routers.of_md(namespace, md_name):
        meta = pod.get("metadata", {})
        lab = meta.get("labels", {})
        if (
            meta.get("namespace") != namespace
            or lab.get(labels.DEPLOYMENT) != md_name
            or lab.get(labels.REVISION) != revision
            or not _ready(pod)
        ):
            continue
        url = router_url(pod)
        if url is None:
            continue
        identity = await resolve_identity(rt, pod, md_uid, pod_identity.ROUTER_ROLES)
        if isinstance(identity, EngineIdentity) and identity.revision == revision:
            return pod, url
    return None


# The revision's engines' activity now (None: one of them could not be read).
EngineReader = Callable[[], Awaitable[tuple[EngineActivity, ...] | None]]


def metrics_reader(
    engines: Sequence[tuple[str, str]], fetch: Callable[[str], Awaitable[str]]
) -> EngineReader:
    """Read each engine's /metrics (``engines``: pod name and engine URL) as EngineActivity."""

    async def one(pod: str, url: str) -> EngineActivity | None:
        try:
            return abort_probe.activity_from_metrics(pod, await fetch(f"{url}/metrics"))
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError) as exc:
            log.info("engine metrics unreadable: %s/metrics: %s", url, exc)
            return None

    async def read() -> tuple[EngineActivity, ...] | None:
        if not engines:
            return None
        found = await asyncio.gather(*(one(pod, url) for pod, url in engines))
        if any(a is None for a in found):
            return None
        return tuple(a for a in found if a is not None)

    return read


def revision_engines(
    rt: Runtime, namespace: str, md_name: str, revision: str
) -> list[tuple[str, str]]:
    """The revision's verified engine pods (the ones its router may send to) and their URLs."""
    found = []
    for pod in list(rt.pods.values()):
        meta = pod.get("metadata", {})
        lab = meta.get("labels") or {}
        if (
            meta.get("namespace") == namespace
            and lab.get(labels.DEPLOYMENT) == md_name
            and lab.get(labels.REVISION) == revision
            and gate.is_verified(pod)
            and (url := gate.engine_url(pod))
        ):
            found.append((gate.pod_name(pod), url))
    return sorted(found)


async def run_content_check(
    rt: Runtime,
    namespace: str,
    md_name: str,
    md_uid: str | None,
    revision: str,
    spec: ModelDeploymentSpec,
    verified_pool_tokens: int | None,
) -> ContentVerdict | None:
    """Plan, send and judge one revision's content check; None when no Ready router of the
    revision is known yet (nothing was sent)."""
    found = await revision_router(rt, namespace, md_name, md_uid, revision)
    if found is None:
        return None
    router, url = found
    key = await engine_api_key(rt, router)
    headers = router_auth.bearer(key) if isinstance(key, str) else {}
    fields = {"namespace": namespace, "deployment": md_name, "revision": revision}
    engines = metrics_reader(revision_engines(rt, namespace, md_name, revision), rt.fetch_text)
    return await check_through(url, revision, spec, verified_pool_tokens, headers, fields, engines)


async def check_through(
    url: str,
    revision: str,
    spec: ModelDeploymentSpec,
    verified_pool_tokens: int | None,
    headers: Mapping[str, str],
    fields: Mapping[str, str],
    engines: EngineReader,
) -> ContentVerdict:
    """Send the content check's probes through the router at ``url``, then its abort step
    (when every length probe passed; ``engines`` reads the revision's engines' activity), and
    judge them."""
    settings = spec.safety.content_probe
    probes = content_probe.plan_probes(
        spec.model.context_length,
        verified_pool_tokens,
        settings,
        content_probe.bounds_of(spec),
    )
    sender = Sender(url, spec.model.name, headers, content_probe.vocab_size_of(spec.model.config))
    findings: list[ProbeFinding] = []
    async with aiohttp.ClientSession() as session:
        for probe in probes:
            answer = await sender.probe(session, probe, settings.timeout_seconds)
            findings.append(_logged(content_probe.judge(probe, answer), fields))
        # Only after every length probe passed: otherwise the check is decided (or reruns).
        if all(f.passed for f in findings):
            plan = abort_probe.plan_abort(
                spec.model.context_length,
                verified_pool_tokens,
                settings,
                content_probe.bounds_of(spec),
            )
            longest = abort_probe.answer_seconds(findings)
            findings += await abort_step(
                session, sender, plan, longest, settings.timeout_seconds, fields, engines
            )
    return content_probe.verdict(revision, findings)


def _logged(finding: ProbeFinding, fields: Mapping[str, str]) -> ProbeFinding:
    log.info(
        "content probe %s: %s (%.1f s)",
        "passed" if finding.passed else "FAILED",
        finding.summary,
        finding.answer.seconds,
        extra=fields,
    )
    return finding


@dataclass(frozen=True)
class Sender:
    """Where and how a revision's probes go: its router, model name, key and vocabulary."""

    url: str
    model: str
    headers: Mapping[str, str]
    vocab_size: int | None

    async def probe(
        self,
        session: aiohttp.ClientSession,
        request: ProbeRequest,
        timeout: float,
        stream: bool = True,
    ) -> ProbeAnswer:
        return await send_probe(
            session,
            self.url,
            self.model,
            request,
            timeout=timeout,
            headers=self.headers,
            vocab_size=self.vocab_size,
            stream=stream,
        )


async def abort_step(
    session: aiohttp.ClientSession,
    sender: Sender,
    plan: abort_probe.AbortPlan,
    longest_seconds: float | None,
    timeout: float,
    fields: Mapping[str, str],
    engines: EngineReader,
) -> tuple[ProbeFinding, ...]:
    """The known answer, a request dropped mid-flight, the known answer again at once and once
    the engines hold no request, with the aborts they counted (kvgate.verify.abort_probe)."""
    started = time.monotonic()
    before = await sender.probe(session, plan.known, timeout, stream=False)
    baseline = abort_probe.aborted_total(await engines())
    drop = abort_probe.drop_after(longest_seconds)
    missed: list[tuple[float, float]] = []
    while True:
        outcome = await send_dropped(
            session,
            sender.url,
            sender.model,
            plan.aborted,
            drop_after=drop,
            timeout=timeout,
            headers=sender.headers,
            vocab_size=sender.vocab_size,
        )
        sooner = abort_probe.sooner_drop(drop, outcome, len(missed) + 1)
        if sooner is None:
            break
        missed.append((drop, outcome.answer.seconds))  # answered in full first: again, sooner
        drop = sooner
    outcome = replace(outcome, missed=tuple(missed))
    dropped_at = time.monotonic()
    at_once = await sender.probe(session, plan.known, timeout, stream=False)
    settle = abort_probe.settle_seconds(drop)
    evidence = await _engines_idle(engines, dropped_at, settle, baseline)
    later = await sender.probe(session, plan.known, timeout, stream=False)
    waited = time.monotonic() - dropped_at - later.seconds
    after = [("right after the abort", at_once), (f"{waited:.2f} s after the abort", later)]
    findings = abort_probe.judge_abort(plan, before, outcome, after, evidence)
    for finding in findings:
        _logged(finding, fields)
    log.info(
        "content check abort step: %.2f s (the drop %s s in, try %d; the known answer after it "
        "in %.2f s)",
        time.monotonic() - started,
        "n/a" if outcome.dropped_after is None else f"{outcome.dropped_after:.2f}",
        len(missed) + 1,
        at_once.seconds,
        extra=fields,
    )
    return findings


async def _engines_idle(
    engines: EngineReader, dropped_at: float, settle: float, baseline: int | None
) -> EngineEvidence:
    """Wait until ``settle`` seconds after the drop and until every engine of the revision
    reports no running or queued request (at most IDLE_DEADLINE_SECONDS after the drop), and
    what they reported then."""
    deadline = dropped_at + abort_probe.IDLE_DEADLINE_SECONDS
    await asyncio.sleep(max(0.0, dropped_at + settle - time.monotonic()))
    busy = ""
    while True:
        activity = await engines()
        now = time.monotonic()
        if activity is not None:
            busy = abort_probe.busy_engines(activity)
            if not busy:
                after = abort_probe.aborted_total(activity)
                return EngineEvidence(baseline, after, now - dropped_at)
        if now >= deadline:
            after = abort_probe.aborted_total(activity)
            return EngineEvidence(baseline, after, None, busy or "their /metrics unreadable")
        await asyncio.sleep(min(abort_probe.IDLE_POLL_SECONDS, max(0.0, deadline - now)))


def _verified_pool(step: RolloutStep) -> int | None:
    pools = [
        p.min_verified_kv_pool_tokens
        for p in step.progress.values()
        if p.min_verified_kv_pool_tokens is not None
    ]
    return min(pools) if pools else None


CheckKey = tuple[str, str, str]  # namespace, ModelDeployment, revision


@dataclass
class ContentChecks:
    """This module's state for one operator run (``Runtime.owned``): each revision's running
    check, its finished verdict until a pass records it in status, and when its last
    inconclusive check ended (the next waits RETRY_SECONDS). A new leader starts clean."""

    tasks: dict[CheckKey, asyncio.Task[None]] = field(default_factory=dict)
    finished: dict[CheckKey, ContentOutcome] = field(default_factory=dict)
    inconclusive: dict[CheckKey, float] = field(default_factory=dict)

    def cancel(self, key: MdKey, keep: CheckKey | None = None) -> None:
        """Stop the ModelDeployment's running checks (all but ``keep``)."""
        for check in [c for c in self.tasks if c[:2] == key and c != keep]:
            self.tasks.pop(check).cancel()

    def forget_md(self, key: MdKey) -> None:
        self.cancel(key)
        for store in (self.finished, self.inconclusive):
            for check in [c for c in store if c[:2] == key]:
                del store[check]


def finished(rt: Runtime, namespace: str, md_name: str, revision: str) -> ContentOutcome | None:
    """The revision's decided check, not yet recorded in status (the pass reads it)."""
    return rt.owned(ContentChecks).finished.get((namespace, md_name, revision))


def recorded(rt: Runtime, namespace: str, md_name: str, revision: str) -> None:
    """A pass wrote the revision's verdict into status: the record there is the truth now."""
    rt.owned(ContentChecks).finished.pop((namespace, md_name, revision), None)


def keep_due(rt: Runtime, md: ModelDeployment, step: RolloutStep) -> None:
    """Start the target's check when the step says it is due (unless it runs, waits to be
    recorded or backs off from an inconclusive one); a check of any other revision of this
    ModelDeployment stops. The check runs as its own task, outside the pass.

    The target's own check in flight goes on when a pass finds the target briefly unable to
    serve (a re-verification that timed out while an engine answered the check's longest
    prompt on a loaded machine): its verdict is about the revision, and restarting it from its
    first probe on every such blip kept a leaky revision from ever being refused by its check
    (it waited for rollout.verifyTimeoutSeconds instead)."""
    namespace, md_name = md.metadata.namespace or "", md.metadata.name or ""
    state = rt.owned(ContentChecks)
    target = (namespace, md_name, step.target_revision)
    state.cancel((namespace, md_name), keep=target)
    due = target if step.content_check_due else None
    if due is None or due in state.finished:
        return
    running = state.tasks.get(due)
    if running is not None and not running.done():
        return
    last = state.inconclusive.get(due)
    if last is not None and time.monotonic() - last < content_probe.RETRY_SECONDS:
        return
    state.tasks[due] = spawn(
        _check(rt, md, due[2], _verified_pool(step)), name=f"content-check-{'/'.join(due)}"
    )


def stop(rt: Runtime, key: MdKey) -> None:
    """The ModelDeployment's loop ended: its running checks stop."""
    rt.owned(ContentChecks).cancel(key)


async def _check(rt: Runtime, md: ModelDeployment, revision: str, pool: int | None) -> None:
    """Send, judge, and keep the verdict for the next pass (which it wakes). An inconclusive
    check keeps nothing and is retried RETRY_SECONDS later; rollout.verifyTimeoutSeconds bounds
    the retries."""
    namespace, md_name = md.metadata.namespace or "", md.metadata.name or ""
    key = (namespace, md_name, revision)
    state = rt.owned(ContentChecks)
    fields = {"namespace": namespace, "deployment": md_name, "revision": revision}
    started = time.monotonic()
    try:
        result = await run_content_check(
            rt, namespace, md_name, md.metadata.uid, revision, md.spec, pool
        )
    except Exception as exc:  # an API read failed: inconclusive, retried like one
        log.warning("content check of %s could not run: %s", revision, exc, extra=fields)
        result = None
    if result is None or not result.conclusive:
        state.inconclusive[key] = time.monotonic()
        log.warning(
            "%s",
            result.message if result else f"content check of {revision}: no Ready router yet",
            extra=fields,
        )
        rt.wake_md(namespace, md_name)
        return
    state.inconclusive.pop(key, None)
    metrics.CONTENT_CHECK_DURATION.labels(namespace, md_name).observe(time.monotonic() - started)
    metrics.CONTENT_CHECKS.labels(namespace, md_name, "passed" if result.passed else "failed").inc()
    (log.info if result.passed else log.warning)("%s", result.message, extra=fields)
    record = content_probe.record_of(revision, result, rfc3339(rt.clock()))
    state.finished[key] = ContentOutcome(result, record)
    rt.wake_md(namespace, md_name)


async def idle(rt: Runtime) -> None:
    """Until every content check this runtime started has ended (tests; shutdown)."""
    while tasks := [t for t in rt.owned(ContentChecks).tasks.values() if not t.done()]:
        await asyncio.gather(*tasks, return_exceptions=True)
