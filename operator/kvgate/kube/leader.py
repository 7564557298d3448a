"""Leader election on a coordination.k8s.io/v1 Lease, so the operator can run as several replicas.

Only the replica holding the Lease runs kopf (every watch, reconcile loop, verifier and audit);
the others wait, serving /healthz and metrics with ``kvgate_leader 0``. The rules are client-go's
(``k8s.io/client-go/tools/leaderelection``), reimplemented:

- A Lease held by someone else is taken over only after ``leaseDurationSeconds`` of *our own*
  clock have passed since we last saw its record change. Other replicas' clocks are never
  compared with ours (``renewTime`` is written for humans and ``kubectl``, not trusted).
- Every write is a PUT carrying the ``resourceVersion`` read just before, so of two replicas
  that try at once exactly one wins (the other gets 409 Conflict and waits).
- The leader renews every ``retry_period``; an attempt may take until ``renew_deadline``
  after the last renewal; if it cannot renew for ``renew_deadline`` (< lease duration) it
  stops leading *before* anyone else may take over.
- A leader that stops cleanly releases the Lease (empty holder), so a standby takes over on its
  next poll instead of waiting for the lease to expire.

``decide`` is the pure part (table-tested); ``LeaderElector`` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from kvgate.kube.k8s import ApiError, KubeApi

log = logging.getLogger("kvgate.kube.leader")

LEASE_API = "/apis/coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaderConfig:
    """Where the Lease lives and how fast leadership moves (the chart's leaderElection values)."""

    namespace: str
    name: str
    identity: str
    lease_duration_seconds: float = 10.0
    renew_deadline_seconds: float = 7.0
    retry_period_seconds: float = 2.0

    def problems(self) -> list[str]:
        """What is wrong with these timings (client-go's rules), each naming the setting."""
        out: list[str] = []
        d, r, p = (
            self.lease_duration_seconds,
            self.renew_deadline_seconds,
            self.retry_period_seconds,
        )
        if not self.identity:
            out.append("the replica's identity is empty; set POD_NAME (the chart does)")
        if p <= 0:
            out.append(f"KVGATE_LEADER_RETRY_PERIOD_SECONDS={p:g}: must be > 0")
        if not r > p:
            out.append(
                f"KVGATE_LEADER_RENEW_DEADLINE_SECONDS={r:g} must be greater than "
                f"KVGATE_LEADER_RETRY_PERIOD_SECONDS={p:g}: a leader must get more than one try "
                "to renew"
            )
        if not d > r:
            out.append(
                f"KVGATE_LEADER_LEASE_DURATION_SECONDS={d:g} must be greater than "
                f"KVGATE_LEADER_RENEW_DEADLINE_SECONDS={r:g}: a leader that cannot renew must "
                "stop before another replica may take over"
            )
        return out


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease's spec that election reads and writes."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.lease_duration_seconds or None,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


class Action(Enum):
    CREATE = "create"  # no Lease yet: create it, holding it
    ACQUIRE = "acquire"  # free or expired: take it over (transitions + 1)
    RENEW = "renew"  # ours: move renewTime
    WAIT = "wait"  # someone else holds it and it has not expired in our clock


@dataclass(frozen=True)
class Decision:
    action: Action
    record: LeaseRecord | None  # what to write (None for WAIT)
    reason: str


def micro_time(epoch: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decide(
    current: LeaseRecord | None,
    *,
    config: LeaderConfig,
    now_wall: float,
    now_mono: float,
    observed_at_mono: float | None,
) -> Decision:
    """What this replica does with the Lease it just read.

    ``observed_at_mono`` is when (our monotonic clock) we first saw the record as it is now; a
    record we see for the first time counts as observed now, so a fresh standby never takes over
    a Lease it has not watched expire."""
    stamp = micro_time(now_wall)
    duration = max(1, round(config.lease_duration_seconds))
    if current is None:
        record = LeaseRecord(config.identity, duration, stamp, stamp, 0)
        return Decision(Action.CREATE, record, "no Lease yet")
    if current.holder == config.identity:
        record = replace(current, renew_time=stamp, lease_duration_seconds=duration)
        return Decision(Action.RENEW, record, "we hold the Lease")
    taking = LeaseRecord(config.identity, duration, stamp, stamp, current.transitions + 1)
    if not current.holder:
        return Decision(Action.ACQUIRE, taking, "the Lease was released")
    seen = now_mono if observed_at_mono is None else observed_at_mono
    # The holder's own duration if it wrote one (it may run with other settings), else ours.
    held_for = current.lease_duration_seconds or duration
    if now_mono - seen >= held_for:
        return Decision(
            Action.ACQUIRE,
            taking,
            f"{current.holder} has not renewed for {now_mono - seen:.1f}s (lease {held_for}s)",
        )
    return Decision(
        Action.WAIT,
        None,
        f"{current.holder} holds the Lease (expires in {held_for - (now_mono - seen):.1f}s)",
    )


class LeaderElector:
    """Acquire, hold and release one Lease through the operator's API client."""

    def __init__(
        self,
        api: KubeApi,
        config: LeaderConfig,
        *,
        on_change: Callable[[bool], None] | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.config = config
        self._on_change = on_change
        self._wall, self._mono = wall, mono
        self._observed: tuple[LeaseRecord, float] | None = None
        self.leading = False
        self.last_renewed_mono: float | None = None

    @property
    def path(self) -> str:
        return f"{LEASE_API}/namespaces/{self.config.namespace}/leases/{self.config.name}"

    def _set_leading(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            if self._on_change is not None:
                self._on_change(leading)

    async def try_once(self) -> bool:
        """Read the Lease and act once; True when we hold it afterwards."""
        lease = await self.api.request("GET", self.path, missing_ok=True)
        now_mono = self._mono()
        current = LeaseRecord.from_lease(lease) if lease is not None else None
        if current is not None and (self._observed is None or self._observed[0] != current):
            self._observed = (current, now_mono)
        observed_at = self._observed[1] if self._observed is not None else None
        decision = decide(
            current,
            config=self.config,
            now_wall=self._wall(),
            now_mono=now_mono,
            observed_at_mono=observed_at,
        )
        if decision.action is Action.WAIT or decision.record is None:
            log.debug("standing by: %s", decision.reason)
            return False
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.config.name, "namespace": self.config.namespace},
            "spec": decision.record.to_spec(),
        }
        try:
            if decision.action is Action.CREATE:
                await self.api.request(
                    "POST", f"{LEASE_API}/namespaces/{self.config.namespace}/leases", body=body
                )
            else:
                assert lease is not None
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                await self.api.request("PUT", self.path, body=body)
        except ApiError as exc:
            if exc.status in (409, 404):  # another replica wrote first: read again next time
                log.debug("lost the race for the Lease (%s)", exc.status)
                return False
            raise
        if decision.action is not Action.RENEW:
            log.info(
                "became the leader",
                extra={
                    "lease": f"{self.config.namespace}/{self.config.name}",
                    "why": decision.reason,
                },
            )
        self._observed = (decision.record, self._mono())
        self.last_renewed_mono = self._mono()
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Poll every retry period until we lead (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            try:
                if await self.try_once():
                    self._set_leading(True)
                    return True
            except (TimeoutError, ApiError, OSError) as exc:
                log.warning("cannot read or write the Lease %s: %s", self.path, exc)
            except Exception as exc:  # aiohttp.ClientError and friends
                log.warning("cannot reach the API server for the Lease %s: %s", self.path, exc)
            await _wait(stop, self.config.retry_period_seconds)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew every retry period; return when ``stop`` is set or the renew deadline passed
        without a successful renewal (leadership lost: the caller must stop leading now)."""
        last_ok = self._mono()
        while not stop.is_set():
            await _wait(stop, self.config.retry_period_seconds)
            if stop.is_set():
                return
            # As client-go: an attempt may take until the renew deadline (a loaded API server
            # answers a GET and a PUT in more than the retry period), never beyond it.
            left = self.config.renew_deadline_seconds - (self._mono() - last_ok)
            try:
                ok = await asyncio.wait_for(self.try_once(), timeout=max(0.05, left))
            except Exception as exc:
                log.warning("cannot renew the Lease %s: %s", self.path, exc)
                ok = False
            now = self._mono()
            if ok:
                last_ok = now
                continue
            # Someone else holds it now (we read their record), or we could not renew in time.
            observed = self._observed[0] if self._observed is not None else None
            if observed is not None and observed.holder not in ("", self.config.identity):
                log.error("lost the Lease to %s", observed.holder)
                self._set_leading(False)
                return
            if now - last_ok >= self.config.renew_deadline_seconds:
                log.error(
                    "could not renew the Lease %s for %.1fs (renew deadline %gs): stepping down",
                    self.path,
                    now - last_ok,
                    self.config.renew_deadline_seconds,
                )
                self._set_leading(False)
                return

    async def release(self) -> None:
        """Give the Lease up (clean shutdown) so a standby takes over at its next poll."""
        if not self.leading:
            return
        self._set_leading(False)
        try:
            lease = await self.api.request("GET", self.path, missing_ok=True)
            if lease is None or LeaseRecord.from_lease(lease).holder != self.config.identity:
                return
            spec = LeaseRecord.from_lease(lease)
            stamp = micro_time(self._wall())
            lease["spec"] = replace(
                spec, holder="", lease_duration_seconds=1, renew_time=stamp
            ).to_spec()
            await self.api.request("PUT", self.path, body=lease)
            log.info("released the Lease %s", self.path)
        except Exception as exc:  # best effort: the lease then expires on its own
            log.warning("could not release the Lease %s: %s", self.path, exc)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


__all__ = ["Action", "Decision", "LeaderConfig", "LeaderElector", "LeaseRecord", "decide"]
