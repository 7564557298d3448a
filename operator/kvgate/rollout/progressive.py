"""Progressive rollouts: the router split of a traffic share, and the step check (pure).

During a progressive step the Service ``<md>`` selects the routers of both revisions in the
traffic set (the serving one and the target), and each router pairs only its own revision's
verified engines, so no request ever crosses revisions. kube-proxy picks one ready endpoint per
connection with equal probability, so the target's share of new connections is the ratio of its
ready routers to all ready routers: ``split_routers`` picks the router counts whose ratio is
closest to the step's weight, using at most ``maxSplitRouters`` routers in all.

The step check reads each of the target's router pods' ``smg_http_responses_total`` counters
(smg 1.13: labels path, status_code, error_code) for the generation paths, and compares them
with the counts recorded when the step began (a pod that restarted counts from zero).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
RESPONSES_METRIC = "smg_http_responses_total"
CLIENT_CLOSED = "499"  # smg's "client closed the connection first": neither answer nor error


@dataclass(frozen=True)
class RouterCounters:
    """One router pod's generation-path responses since it started."""

    pod: str
    requests: int
    errors: int  # 5xx
    rejected: int  # 4xx other than 499 (over-length prompts are 400)


@dataclass(frozen=True)
class StepCheck:
    """The target's routers since the step began, judged against rollout.stepCheck."""

    requests: int
    errors: int
    rejected: int
    failure: str | None  # why the check failed; None: it holds

    @property
    def error_percent(self) -> float:
        return 100.0 * self.errors / self.requests if self.requests else 0.0

    @property
    def rejected_percent(self) -> float:
        return 100.0 * self.rejected / self.requests if self.requests else 0.0

    def summary(self) -> str:
        return (
            f"{self.requests:,} requests, {self.errors:,} failed (5xx, "
            f"{self.error_percent:.1f} %), {self.rejected:,} refused (4xx, "
            f"{self.rejected_percent:.1f} %)"
        )


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
    requests = errors = rejected = 0
    for line in text.splitlines():
        if not line.startswith(RESPONSES_METRIC + "{"):
            continue
        labels_end = line.rfind("}")
        if labels_end < 0:
            continue
        labels = _labels(line[len(RESPONSES_METRIC) + 1 : labels_end])
        if labels.get("path") not in GENERATION_PATHS:
            continue
        try:
            value = int(float(line[labels_end + 1 :].split()[0]))
        except (IndexError, ValueError):
            continue
        status = labels.get("status_code", "")
        if status == CLIENT_CLOSED:
            continue
        requests += value
        if status.startswith("5"):
            errors += value
        elif status.startswith("4"):
            rejected += value
    return RouterCounters(pod, requests, errors, rejected)


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


def check_step(
    baseline: Iterable[RouterCounters],
    now: Iterable[RouterCounters],
    *,
    max_error_percent: float,
    max_rejected_percent: float,
) -> StepCheck:
    """Judge the target's answers since the step began."""
    requests, errors, rejected = since(baseline, now)
    check = StepCheck(requests, errors, rejected, None)
    if requests and check.error_percent > max_error_percent:
        return StepCheck(
            requests,
            errors,
            rejected,
            f"{errors:,} of {requests:,} requests failed ({check.error_percent:.1f} % > "
            f"rollout.stepCheck.maxErrorPercent={max_error_percent:g})",
        )
    if requests and check.rejected_percent > max_rejected_percent:
        return StepCheck(
            requests,
            errors,
            rejected,
            f"{rejected:,} of {requests:,} requests refused ({check.rejected_percent:.1f} % > "
            f"rollout.stepCheck.maxRejectedPercent={max_rejected_percent:g})",
        )
    return check
