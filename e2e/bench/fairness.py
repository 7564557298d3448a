"""Fairness benchmark: one namespace's never-Ready ModelDeployments against another namespace's
rollback and scale request (run as root).

    make bench-fairness FAIRNESS_ARGS="--rounds 5"
    .venv/bin/python e2e/bench/fairness.py --never-ready 200 --rounds 5 [--json out.json]

Not part of ``make test``: it takes the machine for ~10 minutes. Brings up the e2e world
(kvgate installed by Helm with its defaults: 32 pass slots) and a stand-in node
(``kvgate_e2e.standin``: one process plays every pod; an engine reports a KV pool of 2 x its
context, or of half its context when its env says ``KVGATE_STANDIN_POOL_FACTOR=0.5``, so kvgate
never verifies it). Every ModelDeployment has 1 prefill and 1 decode engine. Then:

1. **victim**: ModelDeployment ``victim`` in namespace ``bench-victim`` (decode autoscaled from
   1), rolled to a second revision, so ``status.history`` holds two;
2. **idle**: ``--rounds`` rounds, each one rollback (``kubectl annotate kvmd victim
   kvgate.io/rollback=<the other revision>``) and one scale request (``kubectl scale rolescale
   victim-decode``, alternately 2 and 1): seconds from the command to **acted** (the rollback
   annotation gone, spec restored; the RoleScale's ``status.observedGeneration`` current) and to
   **reconciled** (serving that revision and Ready; the RoleScale's ``status.replicas`` at the
   count with nothing draining); for the rollback also to its engine pods Running (the
   cluster's share) and verified;
3. **loaded**: ``--never-ready`` ModelDeployments whose engines never verify applied in
   namespace ``bench-tenant`` (batches of 100, as fast as ``kubectl apply`` and the webhook take
   them: 50-100 s a batch here), and the same rounds run from the moment the first batch is in,
   beside the rest of the applies and every first pass and first engine read they cause.
   ``--after-applies`` starts the rounds only once all are applied and observed (steady load,
   no apply burst beside them). ``--churn-seconds S`` also annotates every one of them every S
   seconds from ``--churn-workers`` kubectl processes at once (a watch event each, so a pass
   each: a tenant whose ModelDeployments keep changing), and the loaded rounds start once
   ``--full-slots`` pass slots are busy (30: all that passes nobody asked for may hold);
4. the medians of both, and loaded / idle. Each round prints the leader's pass slots when its
   rollback and its scale request start (``kvgate_reconcile_slots_busy`` and
   ``kvgate_reconcile_passes_waiting``), so a loaded round shows whether the slots were full.

    make bench-fairness FAIRNESS_ARGS="--after-applies --churn-seconds 0.5 --rounds 7"

Prints one line per figure and a JSON summary (``--json FILE`` writes it too).
``--operator-pythonpath DIR[:DIR]`` runs the operator from other sources (e.g. an older commit's
``operator`` and ``engine`` folders, ``git archive``d), to measure a change against its parent.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import re
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kvgate_e2e.polling import poll_until
from kvgate_e2e.signals import interrupt_on_signals
from kvgate_e2e.world import World, WorldConfig, load_sample
from scale import CONTROL_PLANE, POOL, gate, leader_cpu_seconds, say, start_standin

VICTIM_NS = "bench-victim"
TENANT_NS = "bench-tenant"
VICTIM = "victim"
ROLLBACK = "kvgate.io/rollback"
POLL_SECONDS = 0.1
NEVER_VERIFIED = [{"name": "KVGATE_STANDIN_POOL_FACTOR", "value": "0.5"}]


def md_manifest(name: str, mem_fraction: float = 0.85, *, verifies: bool = True) -> dict[str, Any]:
    """The llama-8b sample, 1 prefill + 1 decode engine on the stand-in node, no content check
    (a stand-in generates nothing), a verify deadline beyond the run."""
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": name}
    for role in ("prefill", "decode"):
        md["spec"][role]["replicas"] = 1
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": POOL}
        md["spec"][role]["memFractionStatic"] = mem_fraction
    md["spec"]["rollout"]["verifyTimeoutSeconds"] = 3600
    md["spec"].setdefault("safety", {})["contentProbe"] = {"enabled": False}
    if not verifies:
        md["spec"]["engine"]["env"] = NEVER_VERIFIED
    return md


def victim_manifest(mem_fraction: float) -> dict[str, Any]:
    """The victim: its decode role autoscaled (a RoleScale), scale-down not waiting on /metrics
    the stand-in does not serve."""
    md = md_manifest(VICTIM, mem_fraction)
    md["spec"]["decode"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "drainTimeoutSeconds": 1,
    }
    return md


def ready(md: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (md.get("status") or {}).get("conditions") or []
    )


def serving(md: dict[str, Any] | None, revision: str | None = None) -> bool:
    """The ModelDeployment serves its current spec (``revision`` if given), Ready."""
    if md is None:
        return False
    status = md.get("status") or {}
    target = status.get("targetRevision")
    return bool(
        status.get("observedGeneration") == md["metadata"].get("generation")
        and target
        and status.get("servingRevision") == target
        and (revision is None or target == revision)
        and ready(md)
    )


def wait(what: str, predicate: Any, timeout: float) -> float:
    """Poll ``predicate`` every POLL_SECONDS until true; the monotonic time it was seen true."""
    poll_until(what, predicate, timeout, period=POLL_SECONDS)
    return time.monotonic()


def rollback_round(world: World, to: str, timeout: float) -> dict[str, float]:
    """Annotate the victim back to ``to``: seconds to the annotation's removal (kvgate's pass
    acted on it) and to serving ``to``, Ready; on the way, to every engine pod of ``to`` Running
    (the cluster's share) and verified (gate True)."""
    start = time.monotonic()
    world.kubectl("annotate", "kvmd", VICTIM, f"{ROLLBACK}={to}", f"--namespace={VICTIM_NS}")
    seen: dict[str, float] = {}

    def victim() -> dict[str, Any] | None:
        return world.get("modeldeployments.kvgate.io", VICTIM, VICTIM_NS)

    def acted() -> bool:
        md = victim()
        return md is not None and ROLLBACK not in (md["metadata"].get("annotations") or {})

    def engines_of_target() -> None:
        selector = f"kvgate.io/deployment={VICTIM},kvgate.io/revision={to}"
        pods = [
            p
            for p in world.list("pods", VICTIM_NS, selector)
            if p["metadata"].get("labels", {}).get("kvgate.io/component") == "engine"
            and not p["metadata"].get("deletionTimestamp")
        ]
        if len(pods) < 2:  # one prefill, at least one decode
            return
        if all((p.get("status") or {}).get("phase") == "Running" for p in pods):
            seen.setdefault("running", time.monotonic())
        if all(gate(p) == "True" for p in pods):
            seen.setdefault("verified", time.monotonic())

    def serves() -> bool:
        engines_of_target()
        return serving(victim(), to)

    acted_at = wait(f"rollback to {to}: annotation removed", acted, timeout)
    done_at = wait(f"rollback to {to}: serving", serves, timeout)
    return {
        "acted_s": round(acted_at - start, 3),
        "engines_running_s": round(seen.get("running", done_at) - start, 3),
        "engines_verified_s": round(seen.get("verified", done_at) - start, 3),
        "reconciled_s": round(done_at - start, 3),
    }


def scale_round(world: World, replicas: int, timeout: float) -> dict[str, float]:
    """``kubectl scale`` the victim's decode RoleScale: seconds to its status observing the new
    generation (kvgate's pass acted on it) and to ``replicas`` verified Ready, none draining."""
    name = f"{VICTIM}-decode"
    start = time.monotonic()
    world.kubectl("scale", "rolescale", name, f"--replicas={replicas}", f"--namespace={VICTIM_NS}")

    def role_scale() -> dict[str, Any]:
        got = world.get("rolescales.kvgate.io", name, VICTIM_NS)
        assert got is not None, f"RoleScale {name} is gone"
        return got

    def observed(rs: dict[str, Any]) -> bool:
        status = rs.get("status") or {}
        return bool(status.get("observedGeneration") == rs["metadata"].get("generation"))

    def counted() -> bool:
        rs = role_scale()
        status = rs.get("status") or {}
        return (
            observed(rs)
            and status.get("replicas") == rs["spec"]["replicas"] == replicas
            and not status.get("draining")
        )

    acted_at = wait(f"scale to {replicas}: observed", lambda: observed(role_scale()), timeout)
    done_at = wait(f"scale to {replicas}: counted", counted, timeout)
    return {"acted_s": round(acted_at - start, 3), "reconciled_s": round(done_at - start, 3)}


SLOT_SERIES = re.compile(
    r'^kvgate_reconcile_(slots|slots_busy|passes_waiting)(?:\{class="([a-z_]+)"\})? (\S+)$', re.M
)


# The leader's running totals a round is read between: how late its event loop ran what was due
# (kvgate.controller.loop_lag), and its passes' own seconds.
TOTAL_SERIES = re.compile(
    r"^(kvgate_event_loop_lag_seconds|kvgate_reconcile_duration_seconds)_(sum|count) (\S+)$", re.M
)


def pass_slots(world: World) -> dict[str, float]:
    """The leader's pass slots now, from its /metrics: ``slots``, ``busy`` and the passes
    waiting by class (``waiting_requested``, ``waiting_in_flight``, ``waiting_settled``); and
    the running sums and counts of its event-loop lag and pass durations (``lag_sum``,
    ``lag_count``, ``pass_sum``, ``pass_count``)."""
    pod = world.operator_pod()
    assert pod is not None, "no leading operator pod"
    port = world.forward(pod["status"]["podIP"], 8080)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for m in SLOT_SERIES.finditer(text):
        name = {"slots": "slots", "slots_busy": "busy"}.get(m[1], f"waiting_{m[2]}")
        out[name] = int(float(m[3]))
    for m in TOTAL_SERIES.finditer(text):
        prefix = "lag" if "loop_lag" in m[1] else "pass"
        out[f"{prefix}_{m[2]}"] = float(m[3])
    return out


def between(before: dict[str, float], after: dict[str, float], prefix: str) -> float | None:
    """The mean of ``prefix``'s observations between two reads (None if there were none)."""
    count = after.get(f"{prefix}_count", 0) - before.get(f"{prefix}_count", 0)
    if count <= 0:
        return None
    return round((after.get(f"{prefix}_sum", 0) - before.get(f"{prefix}_sum", 0)) / count, 4)


def rounds(
    world: World,
    revisions: tuple[str, str],
    count: int,
    timeout: float,
    label: str,
    first: int = 0,
) -> list[dict[str, Any]]:
    """``count`` rounds; ``first``: the rounds run before, so each round changes something (an
    odd count of idle rounds left the victim at the first revision and at 2 decode engines: a
    loaded first round counted from 0 asked for both again, a no-op)."""
    out = []
    for i in range(first, first + count):
        to = revisions[i % 2]  # back to the first revision, then forward again, ...
        slots_at_rollback = pass_slots(world)
        epoch = time.time()
        rollback = rollback_round(world, to, timeout)
        slots_at_scale = pass_slots(world)
        scale = scale_round(world, 2 if i % 2 == 0 else 1, timeout)
        slots_after = pass_slots(world)
        # The leader's event loop during each part: mean lateness of its 0.25 s timer, and the
        # mean seconds of the passes that ended meanwhile (every ModelDeployment's).
        loop = {
            "rollback_lag_mean_s": between(slots_at_rollback, slots_at_scale, "lag"),
            "scale_lag_mean_s": between(slots_at_scale, slots_after, "lag"),
            "rollback_pass_mean_s": between(slots_at_rollback, slots_at_scale, "pass"),
            "scale_pass_mean_s": between(slots_at_scale, slots_after, "pass"),
        }
        out.append(
            {
                "rollback": rollback,
                "scale": scale,
                "slots_at_rollback": slots_at_rollback,
                "slots_at_scale": slots_at_scale,
                "loop": loop,
                "started_epoch": round(epoch, 3),
            }
        )
        say(
            f"  {label} round {i - first + 1} (epoch {epoch:.3f}): slots busy "
            f"{slots_at_rollback.get('busy')}/{slots_at_rollback.get('slots')}, waiting "
            f"{waiting(slots_at_rollback)}; rollback acted {rollback['acted_s']} s, engines "
            f"Running {rollback['engines_running_s']} s, verified "
            f"{rollback['engines_verified_s']} s, serving {rollback['reconciled_s']} s; slots "
            f"busy {slots_at_scale.get('busy')}, waiting {waiting(slots_at_scale)}; scale acted "
            f"{scale['acted_s']} s, counted {scale['reconciled_s']} s; the leader's loop late "
            f"{loop['rollback_lag_mean_s']} s on average during the rollback, "
            f"{loop['scale_lag_mean_s']} s during the scale; passes "
            f"{loop['rollback_pass_mean_s']} / {loop['scale_pass_mean_s']} s"
        )
    return out


def slots_full(world: World, full: int, timeout: float) -> dict[str, Any]:
    """Wait up to ``timeout`` s for ``full`` pass slots busy (each round's own count is what
    the results show): the seconds it took, or that it did not happen and the most seen."""
    started, most = time.monotonic(), 0
    while time.monotonic() - started < timeout:
        busy = int(pass_slots(world).get("busy", 0))
        most = max(most, busy)
        if busy >= full:
            return {"busy": busy, "after_s": round(time.monotonic() - started, 1)}
        time.sleep(0.5)
    return {"busy": None, "most_busy": most, "after_s": None}


def waiting(slots: dict[str, float]) -> int:
    return int(sum(v for k, v in slots.items() if k.startswith("waiting_")))


def medians(results: list[dict[str, Any]]) -> dict[str, float]:
    return {
        f"{what}_{figure}": round(statistics.median(r[what][figure] for r in results), 3)
        for what in ("rollback", "scale")
        for figure in results[0][what]
    }


class Churn:
    """Annotate every tenant ModelDeployment every ``seconds`` (a watch event each, so a pass
    each), split over ``workers`` threads, each running ``kubectl annotate`` on its share: a
    tenant whose ModelDeployments keep changing, enough to keep kvgate's pass slots full."""

    def __init__(self, world: World, names: list[str], seconds: float, workers: int) -> None:
        self.world, self.seconds = world, seconds
        self.stop = threading.Event()
        self.rounds = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.run, args=(names[i::workers],), daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)

    def run(self, names: list[str]) -> None:
        count = 0
        while not self.stop.wait(self.seconds):
            count += 1
            with self.lock:
                self.rounds += 1
            self.world.kubectl(
                "annotate",
                "kvmd",
                *names,
                f"--namespace={TENANT_NS}",
                f"bench.kvgate.io/churn={count}",
                "--overwrite",
                check=False,
            )


def observed(world: World) -> int:
    """The tenant's ModelDeployments whose current generation kvgate has passed."""
    return sum(
        1
        for md in world.list("modeldeployments.kvgate.io", TENANT_NS)
        if (md.get("status") or {}).get("observedGeneration") == md["metadata"].get("generation")
    )


def apply_tenant(world: World, count: int, result: dict[str, Any]) -> None:
    """Apply the never-Ready ModelDeployments in batches of 100; the seconds the first batch and
    all of them took go into ``result``."""
    docs = [md_manifest(f"never-ready-{i:03d}", verifies=False) for i in range(count)]
    started = time.monotonic()
    for start in range(0, len(docs), 100):
        world.cluster.kubectl(
            "apply",
            f"--namespace={TENANT_NS}",
            "-f",
            "-",
            input=yaml.safe_dump_all(docs[start : start + 100]),
            timeout=600,
        )
        result.setdefault("first_batch_s", round(time.monotonic() - started, 1))
    result["tenant_apply_s"] = round(time.monotonic() - started, 1)


def victim_revisions(world: World, timeout: float) -> tuple[str, str]:
    """Apply the victim, wait for it to serve, roll it to a second revision; both revisions."""
    revisions = []
    for fraction in (0.85, 0.84):  # a different --mem-fraction-static: a new revision
        world.apply(victim_manifest(fraction), VICTIM_NS)
        wait(
            f"victim serving at memFractionStatic {fraction}",
            lambda: serving(world.get("modeldeployments.kvgate.io", VICTIM, VICTIM_NS)),
            timeout,
        )
        md = world.get("modeldeployments.kvgate.io", VICTIM, VICTIM_NS)
        assert md is not None
        revisions.append(md["status"]["targetRevision"])
    assert revisions[0] != revisions[1], revisions
    return revisions[0], revisions[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = dict(kv.split("=", 1) for kv in args.operator_env)
    if args.operator_pythonpath:
        env["PYTHONPATH"] = args.operator_pythonpath
    result: dict[str, Any] = {
        "never_ready": args.never_ready,
        "rounds": args.rounds,
        "churn_seconds": args.churn_seconds,
        "operator_pythonpath": args.operator_pythonpath,
    }
    with World(WorldConfig(operator_env=env, cluster=CONTROL_PLANE)) as world:
        standin, _ = start_standin(world)  # the control port is forwarded and unused here
        churn: Churn | None = None
        try:
            # Routers have no nodeSelector: with the GPU nodes cordoned every new pod lands on
            # the stand-in node.
            for node in world.list("nodes", ""):
                if node["metadata"]["labels"].get("kvgate.io/pool") != POOL:
                    world.kubectl("cordon", node["metadata"]["name"])
            world.create_namespace(VICTIM_NS)
            world.create_namespace(TENANT_NS)
            revisions = victim_revisions(world, args.timeout)
            say(f"victim revisions {revisions[0]} and {revisions[1]}")

            idle = rounds(world, revisions, args.rounds, args.timeout, "idle")
            result["idle"] = idle
            result["idle_medians"] = medians(idle)
            say(f"MEASURED idle medians: {result['idle_medians']}")

            cpu0, t0 = leader_cpu_seconds(world), time.monotonic()
            # The rounds start with the first batch applied, and go on beside the rest.
            applying = threading.Thread(
                target=apply_tenant, args=(world, args.never_ready, result), daemon=True
            )
            applying.start()
            poll_until(
                "the first batch of never-Ready ModelDeployments applied",
                lambda: "first_batch_s" in result or not applying.is_alive(),
                args.timeout,
                period=0.2,
            )
            if args.after_applies:
                # Steady load: every never-Ready ModelDeployment applied and passed once, their
                # engines failing verification again and again; no apply burst beside the rounds.
                applying.join(args.timeout)
                poll_until(
                    "every never-Ready ModelDeployment observed by kvgate",
                    lambda: observed(world) >= args.never_ready,
                    args.timeout,
                    period=1.0,
                )
                result["observed_after_s"] = round(time.monotonic() - t0, 1)
                say(
                    f"all {args.never_ready} observed {result['observed_after_s']} s after the "
                    "first apply"
                )
            if args.churn_seconds:
                names = [f"never-ready-{i:03d}" for i in range(args.never_ready)]
                churn = Churn(world, names, args.churn_seconds, args.churn_workers)
                churn.start()
                result["slots_full_after_s"] = slots_full(world, args.full_slots, 120.0)
                say(f"pass slots under churn: {result['slots_full_after_s']}")
            loaded = rounds(
                world, revisions, args.rounds, args.timeout, "loaded", first=args.rounds
            )
            applying.join(args.timeout)
            say(
                f"applied {args.never_ready} never-Ready ModelDeployments in {TENANT_NS} in "
                f"{result.get('tenant_apply_s')} s (first batch {result.get('first_batch_s')} s)"
            )
            result["loaded"] = loaded
            result["loaded_medians"] = medians(loaded)
            result["loaded_operator_cpu_cores"] = round(
                (leader_cpu_seconds(world) - cpu0) / (time.monotonic() - t0), 2
            )
            if churn is not None:
                result["churn_rounds"] = churn.rounds
            tenant = world.list("modeldeployments.kvgate.io", TENANT_NS)
            result["tenant_ready"] = sum(1 for md in tenant if ready(md))
            result["tenant_observed"] = observed(world)
            result["loaded_over_idle"] = {
                k: round(v / result["idle_medians"][k], 2)
                for k, v in result["loaded_medians"].items()
                if result["idle_medians"][k] > 0
            }
            say(f"MEASURED loaded medians: {result['loaded_medians']}")
            say(f"MEASURED loaded / idle: {result['loaded_over_idle']}")
            say(
                f"MEASURED tenant: {result['tenant_ready']} Ready, {result['tenant_observed']} "
                f"observed of {args.never_ready}; operator CPU while loaded "
                f"{result['loaded_operator_cpu_cores']} cores"
            )
        finally:
            if churn is not None:
                churn.join(60)
            standin.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                standin.wait(30)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--never-ready", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--churn-seconds",
        type=float,
        default=0.0,
        help="annotate every never-Ready ModelDeployment every this many seconds (0: never)",
    )
    parser.add_argument(
        "--churn-workers",
        type=int,
        default=4,
        help="kubectl annotate processes running at once for --churn-seconds",
    )
    parser.add_argument(
        "--full-slots",
        type=int,
        default=30,
        help="with --churn-seconds, the busy pass slots the loaded rounds wait for first",
    )
    parser.add_argument(
        "--after-applies",
        action="store_true",
        help="run the loaded rounds once every never-Ready ModelDeployment is applied and "
        "observed (steady load), not from the first batch on (beside the apply burst)",
    )
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--operator-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--operator-pythonpath",
        help="PYTHONPATH of the operator process (other kvgate sources to measure)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    interrupt_on_signals()  # Ctrl-C or SIGTERM: the world is removed on the way out
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
