"""A tenant dilutes the progressive step check (issue 46 item 4), as a tenant would try it.

The tenant (``kubectl --as`` a ServiceAccount bound to ``edit``) rolls its ModelDeployment out
progressively to a revision B whose decode engines fail every KV transfer (the reference engine's
``fail-transfers`` fault: SGLang's ``KV checksum mismatch``, a 500 for a non-streamed request)
and floods B's router pods with invalid JSON, which smg refuses with a 4xx without calling an
engine. Counted among the step's requests, as they were, the refusals made B's failed share
0.02 % (54 of 284,286) and B was promoted to all traffic. Now the failures are judged against
the requests B *answered*, so B is refused ``StepCheckFailed`` in its first step and the old
revision keeps serving; the refusal's own numbers show that the rule before would have held.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_step_dilution.py -v -s`` (root).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections import Counter
from functools import partial
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import EVENT_DEADLINE, REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import World, http_json
from scenario_helpers import (
    TrafficLoop,
    deadline_loop,
    engine_pods,
    known_answer,
    make_tenant,
    md_story,
    service_revision,
)
from test_scenario_progressive import PAUSE_SECONDS, ROUTERS, progressive_md, serving, status_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
INVALID_JSON = b'{"text": "never closed'
REQUEST = (
    b"POST /generate HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(INVALID_JSON), INVALID_JSON)
)
ROUTER_PORT = 8000  # spec.router.port's default
# The flood's lead before the fault: B's first failed request must meet 1,000 refusals already
# counted, more than 100 x the few failures the first check after it sees (maxErrorPercent=1).
LEAD = 1_000
# A deadline, not a bound: the flood's first LEAD refusals from B's router, which answers each
# invalid request at once (the others are shared ones from kvgate_e2e.deadlines).
FLOOD_DEADLINE = 120
REFUSAL = re.compile(
    r"([\d,]+) of ([\d,]+) answered requests failed \([\d.]+ % > "
    r"rollout\.stepCheck\.maxErrorPercent=1; ([\d,]+) refused with a 4xx are not counted\)"
)


class Flood:
    """Invalid JSON POSTed to ``/generate`` on every router pod of one revision, as fast as the
    answers come back: what any client in the namespace can send to a router's port. Each round
    writes ``BATCH`` requests at once on one keep-alive connection (HTTP/1.1 pipelining) and
    reads their answers: one request at a time through the test's relay waited out a delayed
    ACK each (25 a second, measured). Counts the answers by HTTP status."""

    BATCH = 50

    def __init__(self, world: World, ns: str, md: str, revision: str) -> None:
        self.world, self.ns, self.md, self.revision = world, ns, md, revision
        self.statuses: Counter[int] = Counter()
        self.errors = 0  # connections that broke (a router going away)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self.started = self.stopped = 0.0

    @property
    def refused(self) -> int:
        with self._lock:
            return sum(n for status, n in self.statuses.items() if 400 <= status < 500)

    def _ports(self) -> list[int]:
        pods = self.world.list("pods", self.ns, ROUTERS.format(name=self.md))
        return [
            self.world.forward(p["status"]["podIP"], ROUTER_PORT)
            for p in pods
            if p["metadata"]["labels"].get("kvgate.io/revision") == self.revision
            and (p.get("status") or {}).get("podIP")
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def _run(self) -> None:
        conns: dict[int, socket.socket] = {}
        ports: list[int] = []
        listed = 0.0
        while not self._stop.is_set():
            if time.monotonic() - listed > 2:  # B's routers may change in a step
                with contextlib.suppress(Exception):  # the API server busy: the last list
                    ports = self._ports()
                listed = time.monotonic()
            if not ports:
                self._stop.wait(0.2)
                continue
            for port in ports:
                try:
                    conn = conns.get(port) or socket.create_connection(("127.0.0.1", port), 10)
                    conns[port] = conn
                    conn.sendall(REQUEST * self.BATCH)
                    statuses = read_responses(conn, self.BATCH)
                except OSError:
                    conns.pop(port, socket.socket()).close()
                    with self._lock:
                        self.errors += 1
                    continue
                with self._lock:
                    self.statuses.update(statuses)
        for conn in conns.values():
            conn.close()

    def __enter__(self) -> Flood:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.stopped = time.monotonic()


def read_responses(conn: socket.socket, count: int) -> list[int]:
    """The statuses of the next ``count`` HTTP/1.1 responses on ``conn`` (each with a
    Content-Length or chunked); raises OSError when the connection ends first."""
    buffer, statuses = b"", []
    while len(statuses) < count:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head = buffer[:end].decode("latin-1").split("\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head)}
            rest = buffer[end + 4 :]
            if fields.get("transfer-encoding", "").lower() == "chunked":
                last = rest.find(b"0\r\n\r\n")
                size = last + 5 if last >= 0 else -1
            else:
                size = int(fields.get("content-length", "0"))
                size = size if len(rest) >= size else -1
            if size >= 0:
                statuses.append(int(head[0].split()[1]))
                buffer = rest[size:]
                continue
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("the connection closed")
        buffer += chunk
    return statuses


def refused_or_promoted(world: World, name: str, ns: str, rev_b: str) -> dict[str, Any] | None:
    """B's refusal, or ``{"promoted": ...}`` once B serves: the outcome of B's rollout."""
    status = status_of(world, name, ns)
    if status.get("servingRevision") == rev_b:
        return {"promoted": status.get("trafficSplit")}
    refusal = (status.get("rollout") or {}).get("refusal")
    return dict(refusal) if refusal else None


def test_a_flood_of_invalid_json_does_not_promote_a_revision_whose_decode_fails_its_transfers(
    world: World, namespace: str
) -> None:
    ns, name = namespace, "dilute"
    tenant = make_tenant(world, ns)

    def apply(md: dict[str, Any]) -> None:
        applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(md))
        assert applied.returncode == 0, applied.stderr

    apply(progressive_md(name))
    rev_a = deadline_loop(
        "revision A to serve",
        lambda: serving(world, name, ns),
        REVISION_DEADLINE,
        details=partial(md_story, world, name, ns),
    )
    failing = progressive_md(name)
    failing["spec"]["engine"].setdefault("env", []).append(
        {"name": "KVGATE_REFERENCE_FAULTS", "value": "1"}
    )
    with (
        InvariantSampler(world.cluster, ns, name="step-dilution") as sampler,
        # The clients' own traffic through the Service, as the item measured it (a request
        # every ~0.5 s: 10 % of it reaches B in the first step, 50 % in the second).
        TrafficLoop(lambda: known_answer(world, name, ns), pause=0.5) as traffic,
    ):
        apply(failing)
        rev_b = deadline_loop(
            "revision B in its first step",
            lambda: (
                (status_of(world, name, ns).get("trafficSplit") or "").endswith("=10%")
                and status_of(world, name, ns)["targetRevision"]
            ),
            REVISION_DEADLINE,
            details=partial(md_story, world, name, ns),
        )
        with Flood(world, ns, name, rev_b) as flood:
            deadline_loop(
                f"the flood's first {LEAD:,} refusals from B's router",
                lambda: flood.refused >= LEAD,
                FLOOD_DEADLINE,
                details=lambda: f"flood answers {dict(flood.statuses)}, {flood.errors} broken",
            )
            lead_after = time.monotonic() - flood.started
            for pod in engine_pods(world, ns, name, "decode"):
                if pod["metadata"]["labels"]["kvgate.io/revision"] == rev_b:
                    url = world.engine_url(pod) + "/kvgate/faults/fail-transfers"
                    assert http_json(url, {})[0] == 200
            injected = time.monotonic()
            # Before the fix B was promoted after its two steps' pauses; a refusal comes on the
            # first check pass after B's first failed request (passes run every 5 s).
            outcome = deadline_loop(
                "revision B refused or promoted",
                partial(refused_or_promoted, world, name, ns, rev_b),
                2 * PAUSE_SECONDS + 180,
                details=partial(md_story, world, name, ns),
            )
            decided_after = time.monotonic() - injected
        flood_seconds = flood.stopped - flood.started
        flood_answers = dict(flood.statuses)
        assert "promoted" not in outcome, (
            f"revision B was promoted ({outcome['promoted']}) {decided_after:.1f} s after its "
            f"decode began failing, behind {flood.refused:,} refused requests ({flood_answers})"
        )
        deadline_loop(
            "the Service to select revision A only",
            lambda: service_revision(world, ns, name) == rev_a,
            EVENT_DEADLINE,
        )
        failures_at_rollback = len(traffic.failures)
        calm = time.monotonic()
        deadline_loop(
            "20 requests after the rollback",
            lambda: sum(1 for t, _, _ in traffic.results if t > calm) >= 20,
            STEP_DEADLINE,
        )
        late_failures = [f for f in traffic.failures if f[0] > calm]
    assert outcome["reason"] == "StepCheckFailed", outcome
    found = REFUSAL.search(outcome["message"])
    assert found, outcome["message"]
    failed, answered, refused = (int(g.replace(",", "")) for g in found.groups())
    # The very pass that refused B would have held under the rule before: B's failures were
    # at most 1 % of every request its routers counted, refusals included.
    old_share = 100 * failed / (answered + refused)
    status = status_of(world, name, ns)
    print(
        f"MEASURED step dilution: the flood sent {sum(flood_answers.values()):,} invalid-JSON "
        f"requests to B's router in {flood_seconds:.1f} s ({flood_answers}, {flood.errors} broken "
        f"connections; {LEAD:,} in {lead_after:.1f} s); B refused {decided_after:.1f} s after its "
        f"decode began failing: {failed} of {answered} answered requests failed, {refused:,} "
        f"refused not counted (the rule before: {old_share:.3f} % of all, held); clients: "
        f"{failures_at_rollback} of {len(traffic.results)} requests failed before the rollback, "
        f"{len(late_failures)} after; sampler: {sampler.summary()}"
    )
    assert old_share <= 1.0, (failed, answered, refused)
    assert status["servingRevision"] == rev_a and status["trafficSplit"] == f"{rev_a}=100%"
    assert "KV transfer" in outcome["message"] and rev_a in outcome["message"], outcome
    assert late_failures == [], late_failures[:3]
    sampler.check()
