"""Scale benchmark: N ModelDeployments with E engine pods each on the e2e world (run as root).

    make bench-scale SCALE_ARGS="--mds 1000 --engines 8"
    .venv/bin/python e2e/bench/scale.py --mds 250 --engines 8 [--json out.json]

Not part of ``make test``: it takes the whole machine for minutes. Brings up the e2e world (the
real control plane, kvgate installed by Helm with its defaults: reverify every 30 s, steady
reconcile every 30 s), plus one stand-in node (``kvgate_e2e.standin``: one asyncio process
plays every pod bound to it, answering the engine API from the pod's own flags and reporting
the pod Running and Ready as the kubelet would). Then, with N ModelDeployments pinned to that
node (E/2 prefill + E/2 decode engines and one router each):

1. **reconcile**: every ModelDeployment reconciled (``status.observedGeneration`` current and
   every engine verified) — seconds after the last ``kubectl apply``;
2. **restart**: R engines, one at a time, restarted with a pool below the context (restartCount
   bumped in the pod status) → gate False, then restarted with a safe pool → gate True: seconds
   from the stand-in's acknowledged status patch to the gate seen changed (20 ms polling);
3. **steady state**: the operator's API requests per minute (``kvgate_api_requests_total``,
   by verb and resource) and every client's (``apiserver_request_total``, WATCH excluded) over
   ``--steady-seconds``, with no change in the cluster; operator RSS (median and max);
4. **leader killed** at full size (SIGKILL, no Lease release; the warm standby leads from its
   stores, kvgate.controller.standby): seconds from the kill (and from the new Lease holder) to
   the new Lease holder, to an engine restarted with a pool below the context just after the
   kill refused and then re-admitted, and to a ModelDeployment applied just after the kill
   reconciled; the new leader's RSS (max) and the controller's container restarts. Before it,
   in the steady window, the standby's RSS and its own API requests a minute;
5. **delete**: ``kubectl delete kvmd --all``: seconds until none is left, and until their pods
   are gone.

Prints one line per figure and a JSON summary (``--json FILE`` writes it too).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kvgate_e2e.cluster import ClusterConfig
from kvgate_e2e.kubelet.agent import container_pid
from kvgate_e2e.polling import poll_until
from kvgate_e2e.signals import interrupt_on_signals
from kvgate_e2e.world import OPERATOR_NAMESPACE, World, WorldConfig, load_sample

NAMESPACE = "bench-scale"
POOL = "bench"
GATE = "kvgate.io/engine-verified"
CONTROL_PORT = 18999
IP_RANGE = "198.18.128.0/17"
# The cluster's own controllers at the API rates large clusters run them with (Kubernetes'
# defaults, 20 QPS for each controller-manager controller and 50 for the scheduler, would make
# 9,000 pod creations and bindings alone take 450 s and 180 s). kvgate's settings stay default.
CONTROL_PLANE = ClusterConfig(
    extra_controller_manager_args=(
        "--kube-api-qps=400",
        "--kube-api-burst=800",
        "--concurrent-deployment-syncs=20",
        "--concurrent-replicaset-syncs=20",
        "--concurrent-gc-syncs=40",
    ),
    extra_scheduler_args=("--kube-api-qps=400", "--kube-api-burst=800"),
)


def say(text: str) -> None:
    print(text, flush=True)


def report(result: dict[str, Any], *keys: str) -> None:
    for key in keys:
        say(f"MEASURED {key}: {result[key]}")


def manifest(index: int, engines: int, reverify_seconds: int | None = None) -> dict[str, Any]:
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": f"md-{index:04d}"}
    for role in ("prefill", "decode"):
        md["spec"][role]["replicas"] = engines // 2
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": POOL}
    md["spec"]["rollout"]["verifyTimeoutSeconds"] = 3600
    if reverify_seconds is not None:  # the CR's own field (default 30 s)
        md["spec"]["rollout"]["reverifyIntervalSeconds"] = reverify_seconds
    # The content check sends real prompts through the router; a stand-in generates nothing.
    md["spec"].setdefault("safety", {})["contentProbe"] = {"enabled": False}
    return md


def reconciled(md: dict[str, Any]) -> bool:
    status = md.get("status") or {}
    if not pass_current(md):
        return False
    spec = md["spec"]
    return all(
        (status.get(role) or {}).get("verifiedReplicas") == spec[role]["replicas"]
        for role in ("prefill", "decode")
    )


def pass_current(md: dict[str, Any]) -> bool:
    """kvgate's pass has seen the ModelDeployment's current spec."""
    observed = (md.get("status") or {}).get("observedGeneration")
    return bool(observed == md["metadata"].get("generation"))


def gate(pod: dict[str, Any] | None) -> str | None:
    for cond in ((pod or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == GATE:
            return str(cond.get("status"))
    return None


def operator_pid(world: World) -> int:
    pod = world.operator_pod()
    pid = container_pid(pod, "operator") if pod else None
    if pid is None and pod:
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        pid = int(cid.removeprefix("loopback://"))
    assert pid is not None, "no operator process"
    return pid


def leader_cpu_seconds(world: World) -> float:
    """The leading process's CPU seconds so far (-1: it is between processes)."""
    try:
        return cpu_seconds(operator_pid(world))
    except (AssertionError, FileNotFoundError, KeyError, ValueError):
        return -1.0


def operator_logs(world: World) -> str:
    """Every live controller pod's log (its kopf lines left out)."""
    out = []
    for pod in world.operator_pods():
        name = pod["metadata"]["name"]
        path = world.kubelet.kubelet.log_path(OPERATOR_NAMESPACE, name, "operator")
        out.append(f"----- {name} (Lease holder: {world.leader_name()})")
        if path is not None and path.exists():
            lines = path.read_text(errors="replace").splitlines()
            out.extend(line for line in lines if "kopf." not in line)
    return "\n".join(out) + "\n"


def operator_restarts(world: World) -> int:
    """Container restarts of the live controller pods (the leader and its standby)."""
    return sum(
        int(c.get("restartCount", 0))
        for pod in world.operator_pods()
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def standby_pod(world: World) -> dict[str, Any] | None:
    """A controller pod that does not hold the Lease (the warm standby), if one runs."""
    leader = world.leader_name()
    return next((p for p in world.operator_pods() if p["metadata"]["name"] != leader), None)


def pod_pid(pod: dict[str, Any]) -> int:
    pid = container_pid(pod, "operator")
    if pid is None:
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        pid = int(cid.removeprefix("loopback://"))
    return pid


def operator_requests(world: World, pod: dict[str, Any] | None = None) -> dict[str, float]:
    """kvgate_api_requests_total by ``verb resource``, from the leader's /metrics (or
    ``pod``'s)."""
    pod = pod or world.operator_pod()
    assert pod is not None
    port = world.forward(pod["status"]["podIP"], 8080)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(
        r'^kvgate_api_requests_total\{resource="([^"]*)",verb="([^"]*)"\} (\S+)$', text, re.M
    ):
        out[f"{m[2]} {m[1]}"] = float(m[3])
    return out


def apiserver_requests(world: World) -> float:
    """Every client's non-WATCH requests so far (apiserver_request_total)."""
    text = world.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'verb="WATCH"' not in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def control(port: int, path: str, method: str = "POST") -> dict[str, Any]:
    data = b"" if method == "POST" else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data)
    with urllib.request.urlopen(req, timeout=30) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def until_gate(world: World, pod: str, want: str, since: float) -> float:
    """Seconds from ``since`` (epoch) until the pod's gate is ``want`` (20 ms polling)."""
    poll_until(
        f"pod {pod}: gate {want} after its restart",
        lambda: gate(world.get("pod", pod, NAMESPACE)) == want,
        30,
        period=0.02,
    )
    return time.time() - since


def start_standin(world: World) -> tuple[subprocess.Popen[str], int]:
    cluster = world.cluster
    node_ip = str(cluster.add_node_ip())
    argv = [
        sys.executable,
        "-m",
        "kvgate_e2e.standin",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--node-ip={node_ip}",
        f"--pool={POOL}",
        f"--ip-range={IP_RANGE}",
        f"--control={node_ip}:{CONTROL_PORT}",
    ]
    proc = subprocess.Popen(cluster.netns.exec_argv(argv), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if '"ready": true' not in line:
        raise SystemExit(f"the stand-in node did not start: {line!r}")
    return proc, world.forward(node_ip, CONTROL_PORT)


def leader_killed(
    world: World, args: argparse.Namespace, control_port: int, result: dict[str, Any]
) -> None:
    """The leader killed at full size: the standby takes the Lease and starts with every
    engine pod to list (an earlier operator never finished that list and restarted in a loop).
    Seconds from the kill to: the new Lease holder; an engine restarted just after the kill
    refused (gate False) and re-admitted (gate True) by the new leader; a ModelDeployment
    applied just after the kill reconciled. Also the new leader's RSS (max) and restarts."""
    killed = world.kill_leader()
    kill = time.monotonic()
    fresh = manifest(args.mds, args.engines, args.reverify_seconds)
    world.apply(fresh, NAMESPACE)
    md = f"md-{(args.restarts * 7919) % args.mds:04d}"
    pods = world.list("pods", NAMESPACE, f"kvgate.io/deployment={md},kvgate.io/component=engine")
    name = pods[0]["metadata"]["name"]
    control(control_port, f"/restart?namespace={NAMESPACE}&pod={name}&pool=1000")
    rss: list[float] = []

    def new_leader() -> bool:
        holder = world.leader_name()
        return holder is not None and holder != killed

    poll_until("a new Lease holder", new_leader, 120, period=0.2)
    holder = time.monotonic()
    result["leader_kill_to_new_holder_s"] = round(holder - kill, 1)

    def sampled(predicate: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            with contextlib.suppress(AssertionError, FileNotFoundError, RuntimeError):
                rss.append(rss_mib(operator_pid(world)))
            return predicate()

        return check

    poll_until(
        f"pod {name}: gate False after the leader kill",
        sampled(lambda: gate(world.get("pods", name, NAMESPACE)) == "False"),
        args.timeout,
        period=0.5,
    )
    result["leader_kill_to_restarted_engine_refused_s"] = round(time.monotonic() - kill, 1)
    result["new_holder_to_restarted_engine_refused_s"] = round(time.monotonic() - holder, 1)
    ack = control(control_port, f"/restart?namespace={NAMESPACE}&pod={name}&pool={2 * 131_072}")
    until_gate(world, name, "True", ack["acknowledged"])
    result["leader_kill_to_engine_readmitted_s"] = round(time.monotonic() - kill, 1)
    poll_until(
        "the ModelDeployment applied after the leader kill reconciled",
        sampled(
            lambda: (
                (got := world.get("modeldeployments", fresh["metadata"]["name"], NAMESPACE))
                is not None
                and reconciled(got)
            )
        ),
        args.timeout,
        period=1.0,
    )
    result["leader_kill_to_new_md_reconciled_s"] = round(time.monotonic() - kill, 1)
    result["new_holder_to_new_md_reconciled_s"] = round(time.monotonic() - holder, 1)
    result["new_leader_rss_max_mib"] = round(max(rss), 1) if rss else None
    result["operator_restarts_after_kill"] = operator_restarts(world)
    report(
        result,
        "leader_kill_to_new_holder_s",
        "leader_kill_to_restarted_engine_refused_s",
        "leader_kill_to_engine_readmitted_s",
        "leader_kill_to_new_md_reconciled_s",
        "new_holder_to_restarted_engine_refused_s",
        "new_holder_to_new_md_reconciled_s",
        "new_leader_rss_max_mib",
        "operator_restarts_after_kill",
    )


def standby_at_rest(
    result: dict[str, Any],
    before: dict[str, float],
    after: dict[str, float],
    rss: list[float],
    minutes: float,
) -> None:
    """What standing warm costs: the standby's RSS (median, max) and its own API requests a
    minute by verb (WATCH: watches opened; the Lease reads) over the steady window."""
    by = {k: round((after.get(k, 0) - before.get(k, 0)) / minutes, 1) for k in after}
    result["standby_requests_per_min_by"] = {k: v for k, v in sorted(by.items()) if v}
    result["standby_requests_per_min"] = round(sum(by.values()), 1)
    result["standby_rss_mib"] = (
        {"median": round(statistics.median(rss), 1), "max": round(max(rss), 1)} if rss else None
    )
    report(result, "standby_rss_mib", "standby_requests_per_min", "standby_requests_per_min_by")


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = dict(kv.split("=", 1) for kv in args.operator_env)
    if args.memory_profile:
        env["KVGATE_DEBUG_MEMORY"] = "1"  # tracing costs memory: RSS figures are not comparable
    result: dict[str, Any] = {
        "mds": args.mds,
        "engines_per_md": args.engines,
        "reverify_seconds": args.reverify_seconds or 30,
    }
    with World(WorldConfig(operator_env=env, cluster=CONTROL_PLANE)) as world:
        standin, control_port = start_standin(world)
        try:
            # Routers have no nodeSelector: with the GPU nodes cordoned every new pod lands on
            # the stand-in node (the operator and webhook pods already run on them).
            for node in world.list("nodes", ""):
                if node["metadata"]["labels"].get("kvgate.io/pool") != POOL:
                    world.kubectl("cordon", node["metadata"]["name"])
            world.create_namespace(NAMESPACE)
            result["rss_idle_mib"] = round(rss_mib(operator_pid(world)), 1)
            docs = [manifest(i, args.engines, args.reverify_seconds) for i in range(args.mds)]
            timeline: list[dict[str, Any]] = []
            expected_pods = args.mds * (args.engines + 1)  # engines and one router each

            def where(since: float, applied: int) -> dict[str, Any]:
                """How many are reconciled, and where the rest are: the cluster's share (pods
                not yet bound to the stand-in node, no Running status written yet) against
                kvgate's (passes behind, engines Running but not yet verified)."""
                items = world.list("modeldeployments", NAMESPACE)
                at = {
                    "s": round(time.monotonic() - since, 1),
                    "applied": applied,
                    "reconciled": sum(1 for m in items if reconciled(m)),
                    "passes_current": sum(1 for m in items if pass_current(m)),
                    **control(control_port, "/stats", method="GET"),
                    "operator_cpu_s": round(leader_cpu_seconds(world), 1),
                }
                timeline.append(at)
                say(
                    f"  {at['s']:6.1f}s: {at['reconciled']}/{applied} reconciled; passes "
                    f"current {at['passes_current']}; pods bound {at['pods']}/{expected_pods}; "
                    f"engines running {at['engines_running']}, verified "
                    f"{at['engines_verified']}, ready {at['engines_ready']}; status writes in "
                    f"flight {at['writes']}; operator CPU {at['operator_cpu_s']} s"
                )
                return at

            first = time.monotonic()
            for start in range(0, len(docs), 100):
                world.cluster.kubectl(
                    "apply",
                    f"--namespace={NAMESPACE}",
                    "-f",
                    "-",
                    input=yaml.safe_dump_all(docs[start : start + 100]),
                    timeout=600,
                )
                where(first, min(start + 100, len(docs)))
            last_apply = time.monotonic()
            say(f"applied {args.mds} ModelDeployments in {last_apply - first:.1f}s")

            def done() -> bool:
                return bool(where(last_apply, args.mds)["reconciled"] == args.mds)

            poll_until("every ModelDeployment reconciled", done, args.timeout, period=5.0)
            result["reconciled_after_last_apply_s"] = round(time.monotonic() - last_apply, 1)
            result["reconcile_timeline"] = timeline
            report(result, "reconciled_after_last_apply_s")

            lost, regained = [], []
            for i in range(args.restarts):
                md = f"md-{(i * 7919) % args.mds:04d}"
                pods = world.list(
                    "pods", NAMESPACE, f"kvgate.io/deployment={md},kvgate.io/component=engine"
                )
                name = pods[i % len(pods)]["metadata"]["name"]
                ack = control(control_port, f"/restart?namespace={NAMESPACE}&pod={name}&pool=1000")
                try:  # a miss is counted and reported, and the run goes on to the failover
                    lost.append(until_gate(world, name, "False", ack["acknowledged"]))
                except AssertionError as missed:
                    result.setdefault("restart_missed", []).append(str(missed))
                    say(f"MISSED {missed}")
                pool = 2 * 131_072
                ack = control(
                    control_port, f"/restart?namespace={NAMESPACE}&pod={name}&pool={pool}"
                )
                regained.append(until_gate(world, name, "True", ack["acknowledged"]))
            lost = lost or [float("nan")]
            result["restart_to_gate_false_s"] = {
                "p50": round(statistics.median(lost), 3),
                "max": round(max(lost), 3),
            }
            result["restart_to_reverified_s"] = {
                "p50": round(statistics.median(regained), 3),
                "max": round(max(regained), 3),
            }
            report(result, "restart_to_gate_false_s", "restart_to_reverified_s")

            time.sleep(args.settle_seconds)
            before, api_before, t0 = (
                operator_requests(world),
                apiserver_requests(world),
                time.time(),
            )
            pid = operator_pid(world)  # the leader now (a lost Lease restarts the process)
            spare = standby_pod(world)
            spare_before = operator_requests(world, spare) if spare else {}
            rss, spare_rss, cpu0 = [], [], cpu_seconds(pid)
            while time.time() - t0 < args.steady_seconds:
                rss.append(rss_mib(operator_pid(world)))
                with contextlib.suppress(FileNotFoundError, RuntimeError):
                    spare_rss.append(rss_mib(pod_pid(spare)) if spare else 0.0)
                time.sleep(1.0)
            after, api_after, t1 = operator_requests(world), apiserver_requests(world), time.time()
            spare_after = operator_requests(world, spare) if spare else {}
            minutes = (t1 - t0) / 60
            standby_at_rest(result, spare_before, spare_after, spare_rss, minutes)
            try:
                result["operator_cpu_cores"] = round((cpu_seconds(pid) - cpu0) / (t1 - t0), 3)
            except FileNotFoundError:  # the leader restarted during the window
                result["operator_cpu_cores"] = None
            by = {k: round((after.get(k, 0) - before.get(k, 0)) / minutes, 1) for k in after}
            result["operator_requests_per_min"] = round(sum(by.values()), 1)
            result["operator_requests_per_min_by"] = {k: v for k, v in sorted(by.items()) if v}
            result["apiserver_requests_per_min"] = round((api_after - api_before) / minutes, 1)
            result["rss_mib"] = {
                "median": round(statistics.median(rss), 1),
                "max": round(max(rss), 1),
            }
            report(result, "operator_requests_per_min", "operator_requests_per_min_by")
            result["operator_restarts"] = operator_restarts(world)
            report(result, "apiserver_requests_per_min", "rss_mib", "operator_cpu_cores")
            if args.memory_profile:  # KVGATE_DEBUG_MEMORY=1: the operator's traced heap
                leader = world.operator_pod()
                assert leader is not None
                port = world.forward(leader["status"]["podIP"], 8081)
                url = f"http://127.0.0.1:{port}/debug/memory?top=60"
                args.memory_profile.write_text(
                    urllib.request.urlopen(url, timeout=60).read().decode()
                )
                say(f"operator heap profile written to {args.memory_profile}")
            report(result, "operator_restarts")

            leader_killed(world, args, control_port, result)

            started = time.monotonic()
            world.cluster.kubectl(
                "delete",
                "modeldeployments",
                "--all",
                f"--namespace={NAMESPACE}",
                "--wait=false",
                timeout=600,
            )
            last_delete = time.monotonic()
            poll_until(
                "every ModelDeployment gone",
                lambda: not world.list("modeldeployments", NAMESPACE),
                600,
                period=0.5,
            )
            result["deleted_after_last_delete_s"] = round(time.monotonic() - last_delete, 1)
            result["delete_command_s"] = round(last_delete - started, 1)
            poll_until("every pod gone", lambda: not world.list("pods", NAMESPACE), 900, period=2.0)
            result["pods_gone_after_last_delete_s"] = round(time.monotonic() - last_delete, 1)
            report(result, "deleted_after_last_delete_s", "pods_gone_after_last_delete_s")
        finally:
            if args.operator_log:
                with contextlib.suppress(Exception):
                    args.operator_log.write_text(operator_logs(world))
            standin.terminate()
            standin.wait(30)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mds", type=int, default=100)
    parser.add_argument(
        "--engines", type=int, default=8, help="engine pods per ModelDeployment (even)"
    )
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument(
        "--reverify-seconds",
        type=int,
        help="spec.rollout.reverifyIntervalSeconds of each ModelDeployment (default: the CR's, 30)",
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--settle-seconds", type=float, default=35.0)
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--operator-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--operator-log", type=Path, help="write the controller pods' logs here at the end"
    )
    parser.add_argument(
        "--memory-profile",
        type=Path,
        help="trace the operator's heap (KVGATE_DEBUG_MEMORY=1) and write its largest "
        "allocation sites here after the steady-state window",
    )
    args = parser.parse_args()
    interrupt_on_signals()  # Ctrl-C or SIGTERM: the world is removed on the way out
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
