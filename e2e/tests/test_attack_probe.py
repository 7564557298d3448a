"""A hostile engine answering the probe, as a tenant would try it: whoever writes a ModelDeployment
chooses its engine's image and ``spec.engine.env``, so the engine kvgate probes is the tenant's.
Here the tenant applies (with ``kubectl``, as a namespace editor) ModelDeployments whose reference
engines answer kvgate's ``/server_info``, ``/get_server_info`` and ``/v1/models`` as an attacker
(``KVGATE_REFERENCE_HOSTILE_PREFILL`` / ``_DECODE``, see engine/kvgate_engine/reference/hostile.py)
while ``/health`` stays 200, so every container turns Ready and the operator probes it:

=============  ===========================================  =====================================
ModelDeploym.  prefill engine                               decode engine
=============  ===========================================  =====================================
redirector     302 to the operator's own metrics Service    302 to the sibling's safe decode
               (read-back SSRF)                             engine (a big pool to borrow)
big-bodies     a JSON bomb of ~1.2 M values within 4 MiB    a 16 MiB body, chunked
stallers       HTTP 500 whose body carries a canary         the honest body, one byte per 0.5 s
=============  ===========================================  =====================================

plus ``sibling``, an honest safe ModelDeployment (the redirect's target). With the invariant
sampler running and a watch on every pod, the test shows what a user would see: no hostile pod's
gate ever turns True nor its pod Ready; each gate says what failed in kvgate's words (the HTTP
status, the cap, the deadline); each ModelDeployment keeps waiting with that explanation, and
once the tenant lowers ``rollout.verifyTimeoutSeconds`` (a rollout setting: same revision) it is
refused with a RolloutRefused Event that names it too; no condition, Event or line of the
operator's log holds a byte the engines sent or a redirect's target; the operator pod stays
Ready, never restarts, and its memory stays bounded while the 16 MiB body is probed at the e2e
world's 2 s re-verify interval.

Measured against the probe as it was before it was hardened against hostile engines (43102bc^:
redirects followed, bodies echoed, up to 16 MiB parsed): the redirected decode pod turned verified
on the sibling's report (this test then fails at once), the canary, the body's marker and the
operator's metrics text reached the gate conditions, and the operator's RSS went from 78 MiB to
1,079 MiB (the chart's limit is 512 Mi). With the fix: 78 MiB to ~106-140 MiB.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_probe.py -v -s`` (root).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import METRICS_TIMEOUT, PASS_DEADLINE, REVISION_DEADLINE
from kvgate_e2e.kubelet.agent import container_pid
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    OPERATOR_NAMESPACE,
    SMALL_POOL,
    PodTimeline,
    World,
    condition,
    is_ready,
)
from kvgate_engine.reference.hostile import MARKER
from scenario_helpers import (
    GATE,
    Tenant,
    deadline_loop,
    engine_pods,
    events,
    make_tenant,
    md_condition,
    sample_md,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

SIBLING, REDIRECTOR, BODIES, STALLERS = "sibling", "redirector", "big-bodies", "stallers"
HOSTILE_MDS = (REDIRECTOR, BODIES, STALLERS)
CANARY = "CANARY-tenant-7c41e"
GIVE_UP_SECONDS = 10  # the tenant's verifyTimeoutSeconds once it has read why nothing verifies
MiB = 2**20
RSS_LIMIT = 300 * MiB  # the chart's limit is 512 Mi; before the fix these engines took 1,079 MiB
RSS_WATCH_VERIFICATIONS = 12  # ReportUnreadable verdicts to watch the operator's memory through
PROBE_URL = r"GET http://[\d.]+:30000/server_info"
# Deadlines, not bounds (the run prints when each gate turned): only a step that never happens
# reaches one. Shared ones come from kvgate_e2e.deadlines (every hostile gate False: a revision's
# engines started and judged, REVISION_DEADLINE).
# The sibling's decode pod created by kvgate's first pass, scheduled and given an IP.
POD_IP_DEADLINE = 120
# The sibling's two engines verified (they start with the hostile ones, on the same CPUs).
SIBLING_VERIFIED_DEADLINE = 240
# RSS_WATCH_VERIFICATIONS more ReportUnreadable verdicts: 4 pods every 2 s, so seconds.
VERDICTS_DEADLINE = 120
# A hostile ModelDeployment refused once its verifyTimeoutSeconds is GIVE_UP_SECONDS: that
# timeout, then a pass.
REFUSED_DEADLINE = 60


@dataclass(frozen=True)
class Attack:
    """One hostile engine: the mode its env sets, and what kvgate must say about it."""

    md: str
    role: str
    mode: str  # for the report
    reason: str
    says: str  # a regex of the words of kvgate's message

    def __str__(self) -> str:
        return f"{self.md} {self.role} ({self.mode})"


ATTACKS = (
    Attack(
        REDIRECTOR,
        "prefill",
        "redirect to the operator's metrics",
        "ReportUnreadable",
        PROBE_URL + r": HTTP 302 redirect, not followed \(kvgate follows none\)",
    ),
    Attack(
        REDIRECTOR,
        "decode",
        "redirect to the sibling's decode engine",
        "ReportUnreadable",
        PROBE_URL + r": HTTP 302 redirect, not followed \(kvgate follows none\)",
    ),
    Attack(
        BODIES,
        "prefill",
        "json-bomb",
        "ReportUnreadable",
        PROBE_URL + r": refused unparsed: [\d,]+ JSON values or more in 3,670,016 bytes, "
        r"above the cap of 262,144",
    ),
    Attack(
        BODIES,
        "decode",
        "huge-body",
        "ReportUnreadable",
        PROBE_URL + r": body larger than the 4 MiB cap; kvgate reads no further",
    ),
    Attack(STALLERS, "prefill", "echo (HTTP 500)", "EngineUnreachable", PROBE_URL + r": HTTP 500$"),
    Attack(
        STALLERS,
        "decode",
        "slow-body",
        "EngineUnreachable",
        PROBE_URL + r": no answer within 5 s",
    ),
)


def hostile_md(name: str, prefill: str, decode: str) -> dict[str, Any]:
    """The safe sample whose engines answer kvgate's probe as ``prefill`` / ``decode`` say
    (on the 24 GiB pool: what they would report does not matter, they never report it). A
    refused revision's engines are kept, so they are probed throughout."""
    md = sample_md(name, pool=SMALL_POOL)
    md["spec"]["engine"]["env"] = [
        {"name": "KVGATE_REFERENCE_HOSTILE_PREFILL", "value": prefill},
        {"name": "KVGATE_REFERENCE_HOSTILE_DECODE", "value": decode},
    ]
    md["spec"]["rollout"]["scaleDownRefused"] = False
    return md


def tenant_applies(world: World, ns: str, md: Mapping[str, Any]) -> None:
    out = Tenant(world, ns).kubectl("apply", "-f", "-", input=yaml.safe_dump(dict(md)))
    assert "created" in out.stdout, out


# --------------------------------------------------------------------------------- watching
class GateTimeline(PodTimeline):
    """PodTimeline, plus when each pod was first seen Ready and its gate first seen False, and
    every gate message seen (a real watch: nothing between two polls is missed)."""

    def __init__(self, world: World, namespace: str) -> None:
        super().__init__(world, namespace, "kvgate.io/component=engine")
        self.pod_ready: dict[str, float] = {}
        self.gate_failed: dict[str, tuple[float, str, str]] = {}
        self.gate_messages: set[str] = set()

    def _record(self, pod: Mapping[str, Any]) -> None:
        super()._record(pod)
        now = time.monotonic()
        name = str(pod["metadata"]["name"])
        if is_ready(pod):
            self.pod_ready.setdefault(name, now)
        gate = condition(pod, GATE)
        if gate is not None:
            self.gate_messages.add(str(gate.get("message", "")))
            if gate.get("status") == "False":
                reason, message = str(gate.get("reason")), str(gate.get("message"))
                self.gate_failed.setdefault(name, (now, reason, message))


def operator_pid(world: World) -> int:
    pod = world.operator_pod()
    pid = container_pid(pod, "operator") if pod else None
    assert pid is not None, "the operator container is not running"
    return pid


def session_rss(leader: int) -> int:
    """Resident memory, in bytes, of every process in ``leader``'s session (the container: the
    loopback kubelet starts each in a new session, and ``exec``s the program)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != leader:  # state ppid pgrp session ...
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        total += int(match.group(1)) * 1024 if match else 0
    return total


class RssWatch:
    """Samples the operator container's RSS every 0.25 s from a thread (peak and samples)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), session_rss(self.pid)))
            self._stop.wait(0.25)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def peak(self, since: float = 0.0) -> int:
        return max((rss for at, rss in self.samples if at >= since), default=0)


def metrics_service(world: World) -> tuple[str, int]:
    """The operator's metrics Service: (ClusterIP, port)."""
    services = world.list(
        "services",
        OPERATOR_NAMESPACE,
        "app.kubernetes.io/service=metrics,app.kubernetes.io/component=operator",
    )
    assert len(services) == 1, [s["metadata"]["name"] for s in services]
    spec = services[0]["spec"]
    return str(spec["clusterIP"]), int(spec["ports"][0]["port"])


def report_unreadable_verdicts(world: World) -> float:
    """The operator's kvgate_verifications_total{reason="ReportUnreadable"}, read from its
    metrics Service as Prometheus would."""
    ip, port = metrics_service(world)
    url = f"http://127.0.0.1:{world.forward(ip, port)}/metrics"
    with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvgate_verifications_total{") and 'reason="ReportUnreadable"' in line
    )


def the_pod(world: World, ns: str, md: str, role: str) -> dict[str, Any] | None:
    pods = [p for p in engine_pods(world, ns, md, role) if p.get("status", {}).get("podIP")]
    return pods[0] if len(pods) == 1 else None


def gate_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    return condition(pod, GATE)


def refused(world: World, ns: str, md: str) -> dict[str, Any] | None:
    """The ModelDeployment's Ready condition once it says RolloutRefused."""
    ready = md_condition(world, md, ns, "Ready")
    return ready if ready is not None and ready["reason"] == "RolloutRefused" else None


def refusal_events(world: World, ns: str, md: str) -> list[dict[str, Any]]:
    return [e for e in events(world, ns, "RolloutRefused") if e["involvedObject"]["name"] == md]


# --------------------------------------------------------------------------------- the test
def test_hostile_engines_never_verify_never_leak_what_they_send_and_never_exhaust_the_operator(
    world: World, namespace: str
) -> None:
    ns = namespace
    operator = world.operator_pod()
    assert operator is not None and is_ready(operator)
    operator_uid = operator["metadata"]["uid"]
    restarts = (operator["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0)
    metrics_ip, metrics_port = metrics_service(world)
    # In a real cluster the tenant would write http://kvgate-metrics.kvgate-system.svc:8080;
    # this world has no cluster DNS, so the redirect names the Service's ClusterIP.
    metrics_target = f"{metrics_ip}:{metrics_port}"
    make_tenant(world, ns)
    pid = operator_pid(world)
    baseline = session_rss(pid)
    with (
        RssWatch(pid) as rss,
        GateTimeline(world, ns) as timeline,
        InvariantSampler(world.cluster, ns, name="attack-probe") as sampler,
    ):
        applied = time.monotonic()
        tenant_applies(world, ns, sample_md(SIBLING))
        tenant_applies(world, ns, hostile_md(BODIES, "json-bomb", "huge-body"))
        tenant_applies(world, ns, hostile_md(STALLERS, f"echo:{CANARY}", "slow-body"))
        sibling_decode = deadline_loop(
            "the sibling's decode pod to get an IP",
            lambda: the_pod(world, ns, SIBLING, "decode"),
            POD_IP_DEADLINE,
        )
        sibling_target = f"{sibling_decode['status']['podIP']}:30000"
        tenant_applies(
            world,
            ns,
            hostile_md(
                REDIRECTOR,
                f"redirect:http://{metrics_target}/metrics",
                f"redirect:http://{sibling_target}{{path}}",
            ),
        )

        # 1. Every hostile pod's gate turns False with kvgate's words for what failed.
        def hostile_verified() -> list[str]:
            prefixes = tuple(f"{md}-" for md in HOSTILE_MDS)
            return sorted(name for name in timeline.verified if name.startswith(prefixes))

        def gates_failed() -> tuple[dict[Attack, dict[str, Any]], list[str]] | None:
            """Every hostile pod with its failed gate; or, at once, any hostile pod verified."""
            worked = hostile_verified()
            if worked:
                return {}, worked
            found: dict[Attack, dict[str, Any]] = {}
            for attack in ATTACKS:
                pod = the_pod(world, ns, attack.md, attack.role)
                gate = gate_of(pod) if pod else None
                if pod is None or gate is None or gate["status"] != "False":
                    return None
                if gate["reason"] != attack.reason:
                    return None
                if pod["metadata"]["name"] not in timeline.gate_failed:
                    return None  # its watch is behind this read (a loaded machine): not yet timed
                found[attack] = pod
            return found, []

        pods, attack_worked = deadline_loop(
            "every hostile pod's gate to say why it failed", gates_failed, REVISION_DEADLINE
        )
        assert not attack_worked, f"hostile engine pods were verified: {attack_worked}"
        print(f"MEASURED every hostile gate False {time.monotonic() - applied:.1f}s after apply")
        for attack, pod in pods.items():
            gate = gate_of(pod)
            assert gate is not None
            name = pod["metadata"]["name"]
            assert gate["message"].startswith(f"{attack.role} pod {name} could not be verified: ")
            assert re.search(attack.says, gate["message"]), (str(attack), gate["message"])
            assert pod["status"]["podIP"] in gate["message"]  # the URL kvgate built, no other
            failed_at, _, _ = timeline.gate_failed[name]
            ready_at = timeline.container_ready.get(name)
            took = f"{failed_at - ready_at:.1f}s" if ready_at is not None else "?"
            print(f"MEASURED {attack}: gate {gate['reason']} {took} after the engine was Ready")

        # 2. The redirect's target is a safe engine, verified, and it still verifies nobody else.
        deadline_loop(
            "the sibling's engines to be verified",
            lambda: (
                all(
                    (g := gate_of(p)) is not None and g["status"] == "True"
                    for p in engine_pods(world, ns, SIBLING)
                )
                and len(engine_pods(world, ns, SIBLING)) == 2
            ),
            SIBLING_VERIFIED_DEADLINE,
        )

        # 3. The 16 MiB body, probed again and again: the operator's memory stays bounded.
        huge = next(a for a in ATTACKS if a.mode == "huge-body")
        watch_from = time.monotonic()
        start = report_unreadable_verdicts(world)
        counted = deadline_loop(
            f"{RSS_WATCH_VERIFICATIONS} more ReportUnreadable verdicts (4 pods, every 2 s)",
            lambda: (
                (n := report_unreadable_verdicts(world) - start) >= RSS_WATCH_VERIFICATIONS and n
            ),
            VERDICTS_DEADLINE,
        )
        peak = rss.peak(watch_from)
        print(
            f"MEASURED operator RSS: {baseline / MiB:.0f} MiB before the attacks, peak "
            f"{rss.peak() / MiB:.0f} MiB overall, {peak / MiB:.0f} MiB over {counted:.0f} "
            f"ReportUnreadable verdicts in {time.monotonic() - watch_from:.1f}s while "
            f"{huge} was re-probed"
        )
        assert rss.peak() < RSS_LIMIT, f"operator RSS peaked at {rss.peak() / MiB:.0f} MiB"

        # 4. The ModelDeployments keep waiting and say why; once the tenant lowers the timeout
        #    (a rollout setting: the same revision), each is refused with an Event saying why.
        for md in HOSTILE_MDS:
            says = [a.says for a in ATTACKS if a.md == md]
            ready = md_condition(world, md, ns, "Ready")
            assert ready is not None and ready["status"] == "False", ready
            assert ready["reason"] == "AwaitingVerification", ready
            assert "prefill 0/1 verified, decode 0/1 verified; nothing serves" in ready["message"]
            verified = md_condition(world, md, ns, "EnginesVerified")
            assert verified is not None and verified["status"] == "False", verified
            assert any(re.search(s, verified["message"]) for s in says), verified
            patch = {"spec": {"rollout": {"verifyTimeoutSeconds": GIVE_UP_SECONDS}}}
            out = Tenant(world, ns).kubectl(
                "patch", "kvmd", md, "--type=merge", "-p", json.dumps(patch)
            )
            assert out.returncode == 0, out.stderr
        for md in HOSTILE_MDS:
            says = [a.says for a in ATTACKS if a.md == md]
            ready = deadline_loop(
                f"{md} to be refused", partial(refused, world, ns, md), REFUSED_DEADLINE
            )
            assert ready["status"] == "False" and "nothing serves" in ready["message"], ready
            assert any(re.search(s, ready["message"]) for s in says), ready
            refusal = deadline_loop(
                f"{md}'s RolloutRefused Event",
                partial(refusal_events, world, ns, md),
                PASS_DEADLINE,
            )[0]
            assert refusal["type"] == "Warning" and "(VerificationTimeout)" in refusal["message"]
            assert any(re.search(s, refusal["message"]) for s in says), refusal["message"]
            print(f"MEASURED {md} refused: {refusal['message']}")

        # 5. Never Ready, never verified, seen through a watch from the start.
        hostile_pods = {p["metadata"]["name"] for p in pods.values()}
        assert not hostile_pods & set(timeline.verified), timeline.verified
        assert not hostile_pods & set(timeline.pod_ready), timeline.pod_ready
        for attack, pod in pods.items():
            now = the_pod(world, ns, attack.md, attack.role)
            assert now is not None and now["metadata"]["uid"] == pod["metadata"]["uid"], attack
            assert not is_ready(now) and (gate_of(now) or {}).get("status") == "False", attack

        # 6. Nothing the engines sent, nor the redirects' targets, reached anything kvgate wrote.
        secrets = (CANARY, MARKER, sibling_target, metrics_target, "# HELP", "sglang.launch_server")
        written = {
            "gate conditions": "\n".join(timeline.gate_messages),
            "ModelDeployment conditions": "\n".join(
                str(c.get("message"))
                for md in (*HOSTILE_MDS, SIBLING)
                for c in ((world.get_md(md, ns) or {}).get("status") or {}).get("conditions") or []
            ),
            "Events": "\n".join(str(e.get("message")) for e in events(world, ns)),
        }
        for where, text in written.items():
            for secret in secrets:
                assert secret not in text, f"{secret!r} reached the {where}:\n{text}"
        log = world.operator_log(100_000)
        for secret in (CANARY, MARKER):
            assert secret not in log, f"{secret!r} reached the operator's log"

        # 7. The operator never went down.
        operator = world.operator_pod()
        assert operator is not None and is_ready(operator)
        assert operator["metadata"]["uid"] == operator_uid
        status = (operator["status"].get("containerStatuses") or [{}])[0]
        assert status.get("restartCount", 0) == restarts, status
        print(f"MEASURED invariant sampler: {sampler.stats.samples} samples")
