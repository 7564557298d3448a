"""Progressive rollouts: the router split of a traffic share, and the step check (pure).

During a progressive step the Service ``<md>`` selects the routers of both revisions in the
traffic set (the serving one and the target), and each router pairs only its own revision's
verified engines, so no request ever crosses revisions. kube-proxy picks one ready endpoint per
connection with equal probability, so the target's share of new connections is the ratio of its
ready routers to all ready routers: ``split_routers`` picks the router counts whose ratio is
closest to the step's weight, using at most ``maxSplitRouters`` routers in all.

The step check reads each of the target's router pods' counters for the generation paths and
compares them with the counts recorded when the step began (a pod that restarted counts from
zero). What smg 1.13 writes (observed on a real ``smg launch --pd-disaggregation``):

- ``smg_http_responses_total{path, status_code, error_code}`` records the status of the
  response *head*. A 5xx failed. So did a 499 (``client_closed_request``): smg gives a request
  it dropped unanswered (a handler panic, a forced shutdown) the same labels as one whose client
  went away, so kvgate cannot tell them apart and counts both (the unsafe direction is passing a
  failing revision). A 2xx with an error code (``stream_error``: a body that broke after its
  head) failed too;
- a decode stream that breaks after its 200 head is not labelled so in PD mode: smg ends its own
  stream cleanly with an in-band ``{"error": {"type": "stream_error"}}`` event and counts a 200
  with no error code; only ``smg_router_request_errors_total{endpoint, error_type="backend_error"}``
  counts it. A non-streamed 5xx from decode is counted in both series, so the failures are the
  larger of the two counts, never their sum (a lower bound when both kinds happen at once);
- a stream the engine itself ends cleanly with an error event (SGLang's in-band error, an abort
  finish reason) is a plain 200 in every smg series: the router's counters cannot see it.

So the check also reads the target's engine pods' SGLang counters (``--enable-metrics``, which
kvgate always passes) for the requests a PD engine failed whatever its answer looked like:
``sglang:num_transfer_failed_reqs_total`` (a KV transfer that failed or arrived with a checksum
mismatch; prefill and decode both count it) and ``sglang:num_bootstrap_failed_reqs_total``.
``sglang:num_aborted_requests_total`` is not read: SGLang's tokenizer counts a client's
disconnect there too, which is no engine failure. One failed transfer may be counted by both
of its engines, and a non-streamed one also reaches the router as a 5xx, so the engines' count
is the larger of the prefill pods' and the decode pods' sums, and the failures the larger of
the routers' and the engines' counts (a lower bound, never a double count).

The failures are judged against the requests the target *answered*: every generation request
except those refused with a 4xx other than 499. A refusal is no evidence either way: smg answers
an invalid body (not JSON, a missing field) with a 4xx without calling an engine, and an engine
refuses an over-length prompt before it spends anything on it, so any client that can reach the
Service could send refusals by the hundred thousand. Counted in the denominator, 284,224 invalid
JSON bodies made 54 failed requests (and 10 failed KV transfers) of a failing revision 0.02 % and
promoted it (issue 46); counted toward ``minRequests``, they ended a step that no engine had
served. So refusals count only toward their own share (``maxRejectedPercent``, of every
request), which can fail a step but never pass one. The answered requests are at least the
failures: an engine's failures beyond what the routers answered were hidden under 4xx heads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
RESPONSES_METRIC = "smg_http_responses_total"
ROUTER_ERRORS_METRIC = "smg_router_request_errors_total"
# smg_router_request_errors_total's endpoint label for GENERATION_PATHS
GENERATION_ENDPOINTS = frozenset({"generate", "completions", "chat"})
TRANSFER_FAILED_METRIC = "sglang:num_transfer_failed_reqs_total"
BOOTSTRAP_FAILED_METRIC = "sglang:num_bootstrap_failed_reqs_total"
BACKEND_ERROR = "backend_error"  # an upstream engine failed, before or after its head
CLIENT_CLOSED = "499"  # the client went away, or smg dropped the request unanswered


@dataclass(frozen=True)
class RouterCounters:
    """One router pod's generation-path responses since it started."""

    pod: str
    requests: int
    errors: int  # 5xx
    rejected: int  # 4xx other than 499 (over-length prompts are 400)


@dataclass(frozen=True)
class EngineFailures:
    """One engine pod's failed PD requests since it started (SGLang's scheduler counters), or
    since the step began (``engine_failures_since``)."""

    pod: str
    role: str  # prefill or decode (the pod's kvgate.io/role)
    transfers: int  # sglang:num_transfer_failed_reqs_total
    bootstraps: int  # sglang:num_bootstrap_failed_reqs_total

    def describe(self) -> str:
        parts = []
        if self.transfers:
            parts.append(f"{self.transfers:,} KV transfer{'s' if self.transfers != 1 else ''}")
        if self.bootstraps:
            parts.append(f"{self.bootstraps:,} bootstrap{'s' if self.bootstraps != 1 else ''}")
        return f"{' and '.join(parts)} failed on {self.role} pod {self.pod}"


@dataclass(frozen=True)
class StepCheck:
    """The target's routers and engines since the step began, judged against rollout.stepCheck."""

    requests: int  # every generation request, refused ones included
    errors: int
    rejected: int  # refused with a 4xx other than 499: no evidence of health, nor of failure
    failure: str | None  # why the check failed; None: it holds
    engine_failures: tuple[EngineFailures, ...] = ()  # the engines' counts since the step began

    @property
    def answered(self) -> int:
        """The requests the failures are judged against (and ``minRequests`` counts): every
        request not refused with a 4xx, and at least the failures."""
        return max(self.requests - self.rejected, self.errors)

    @property
    def error_percent(self) -> float:
        return 100.0 * self.errors / self.answered if self.answered else 0.0

    @property
    def rejected_percent(self) -> float:
        return 100.0 * self.rejected / self.requests if self.requests else 0.0

    def summary(self) -> str:
        return (
            f"{self.requests:,} requests: {self.rejected:,} refused (4xx, "
            f"{self.rejected_percent:.1f} %), {self.answered:,} answered, of which "
            f"{self.errors:,} failed (5xx, 499, broken streams, failed KV transfers: "
            f"{self.error_percent:.1f} %){self.where()}"
        )

    def not_counted(self, verb: str) -> str:
        """``; 284,224 refused with a 4xx <verb> not counted`` (empty without refusals)."""
        return f"; {self.rejected:,} refused with a 4xx {verb}" if self.rejected else ""

    def where(self) -> str:
        """``; 3 KV transfers failed on decode pod x`` (empty when no engine counted one)."""
        return "".join(f"; {f.describe()}" for f in self.engine_failures)


def split_routers(weight: int, max_routers: int) -> tuple[int, int]:
    """(serving routers, target routers) whose ratio is closest to ``weight`` percent.

    Both counts are at least one (a step keeps both revisions in traffic); among equally close
    ratios the fewest routers win. The error is at most 1/(2 x max_routers) of the requests.
    """
    if not 0 < weight < 100:
        raise ValueError(f"weight must be between 1 and 99 percent, got {weight}")
    if max_routers < 2:
        raise ValueError(f"maxSplitRouters must be at least 2, got {max_routers}")
    best: tuple[float, int, int, int] | None = None
    for total in range(2, max_routers + 1):
        for target in range(1, total):
            error = abs(target / total - weight / 100)
            candidate = (round(error, 12), total, total - target, target)
            if best is None or candidate < best:
                best = candidate
    assert best is not None
    return best[2], best[3]


def share_percent(serving_routers: int, target_routers: int) -> int:
    """The target's share of new connections for these ready router counts."""
    total = serving_routers + target_routers
    return round(100 * target_routers / total) if total else 0


def counters_from_metrics(pod: str, text: str) -> RouterCounters:
    """Sum one router's generation-path responses from its Prometheus text exposition."""
    requests = failed = rejected = broken = 0
    for line in text.splitlines():
        sample = _sample(line)
        if sample is None:
            continue
        metric, labels, value = sample
        if metric == ROUTER_ERRORS_METRIC:
            if (
                labels.get("endpoint") in GENERATION_ENDPOINTS
                and labels.get("error_type") == BACKEND_ERROR
            ):
                broken += value
            continue
        if labels.get("path") not in GENERATION_PATHS:
            continue
        status = labels.get("status_code", "")
        requests += value
        if status.startswith("5") or status == CLIENT_CLOSED:
            failed += value
        elif status.startswith("2") and labels.get("error_code"):
            failed += value  # smg's stream_error: the body broke after a 2xx head
        elif status.startswith("4"):
            rejected += value
    return RouterCounters(pod, requests, max(failed, broken), rejected)


def engine_failures_from_metrics(pod: str, role: str, text: str) -> EngineFailures:
    """Sum one engine pod's failed-transfer and failed-bootstrap counters (every rank's series)
    from its Prometheus text exposition; an engine that writes neither has failed none."""
    transfers = bootstraps = 0
    for line in text.splitlines():
        sample = _sample(line, (TRANSFER_FAILED_METRIC, BOOTSTRAP_FAILED_METRIC))
        if sample is None:
            continue
        metric, _, value = sample
        if metric == TRANSFER_FAILED_METRIC:
            transfers += value
        else:
            bootstraps += value
    return EngineFailures(pod, role, transfers, bootstraps)


def _sample(
    line: str, metrics: tuple[str, ...] = (RESPONSES_METRIC, ROUTER_ERRORS_METRIC)
) -> tuple[str, dict[str, str], int] | None:
    """``metric{labels} value`` of one of ``metrics``, else None."""
    metric, brace, rest = line.partition("{")
    if not brace or metric not in metrics:
        return None
    labels_end = rest.rfind("}")
    if labels_end < 0:
        return None
    try:
        value = int(float(rest[labels_end + 1 :].split()[0]))
    except (IndexError, ValueError):
        return None
    return metric, _labels(rest[:labels_end]), value


def _labels(raw: str) -> dict[str, str]:
    """``a="x",b="y"`` (values without escaped quotes, as smg writes them) → dict."""
    out: dict[str, str] = {}
    for part in raw.split('",'):
        key, sep, value = part.partition('="')
        if sep:
            out[key.strip().lstrip(",")] = value.rstrip('"')
    return out


def since(
    baseline: Iterable[RouterCounters], now: Iterable[RouterCounters]
) -> tuple[int, int, int]:
    """(requests, errors, rejected) the pods answered since ``baseline``; a pod whose counters
    went down restarted and counts from zero, a pod not in the baseline from zero."""
    before: Mapping[str, RouterCounters] = {c.pod: c for c in baseline}
    requests = errors = rejected = 0
    for current in now:
        base = before.get(current.pod)
        if base is None or current.requests < base.requests:
            base = RouterCounters(current.pod, 0, 0, 0)
        requests += current.requests - base.requests
        errors += max(0, current.errors - base.errors)
        rejected += max(0, current.rejected - base.rejected)
    return requests, errors, rejected


def engine_failures_since(
    baseline: Iterable[EngineFailures], now: Iterable[EngineFailures]
) -> tuple[EngineFailures, ...]:
    """The pods that failed requests since ``baseline``, with how many; a counter below its
    baseline means the engine restarted and counts from zero, a pod not in the baseline too."""
    before: Mapping[str, EngineFailures] = {f.pod: f for f in baseline}
    out = []
    for current in now:
        base = before.get(current.pod)
        transfers, bootstraps = current.transfers, current.bootstraps
        if base is not None and transfers >= base.transfers and bootstraps >= base.bootstraps:
            transfers -= base.transfers
            bootstraps -= base.bootstraps
        if transfers or bootstraps:
            out.append(EngineFailures(current.pod, current.role, transfers, bootstraps))
    return tuple(out)


def engines_failed(failures: Iterable[EngineFailures]) -> int:
    """Failed requests the engines counted: the larger of the roles' sums (a failed transfer
    may be counted by its prefill and by its decode)."""
    per_role: dict[str, int] = {}
    for f in failures:
        per_role[f.role] = per_role.get(f.role, 0) + f.transfers + f.bootstraps
    return max(per_role.values(), default=0)


def check_step(
    baseline: Iterable[RouterCounters],
    now: Iterable[RouterCounters],
    *,
    max_error_percent: float,
    max_rejected_percent: float,
    engine_baseline: Iterable[EngineFailures] = (),
    engines: Iterable[EngineFailures] = (),
) -> StepCheck:
    """Judge the target's answers since the step began: the routers' failures or, when larger,
    the failed requests its engines counted (at most one per request the routers counted),
    against the requests it answered (refusals are no evidence: module docstring)."""
    requests, errors, rejected = since(baseline, now)
    failed = engine_failures_since(engine_baseline, engines)
    errors = max(errors, min(requests, engines_failed(failed)))
    check = StepCheck(requests, errors, rejected, None, failed)
    if check.answered and check.error_percent > max_error_percent:
        return StepCheck(
            requests,
            errors,
            rejected,
            f"{errors:,} of {check.answered:,} answered requests failed "
            f"({check.error_percent:.1f} % > rollout.stepCheck.maxErrorPercent="
            f"{max_error_percent:g}{check.not_counted('are not counted')}){check.where()}",
            failed,
        )
    if requests and check.rejected_percent > max_rejected_percent:
        return StepCheck(
            requests,
            errors,
            rejected,
            f"{rejected:,} of {requests:,} requests refused ({check.rejected_percent:.1f} % > "
            f"rollout.stepCheck.maxRejectedPercent={max_rejected_percent:g})",
            failed,
        )
    return check
