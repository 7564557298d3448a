"""Webhook latency under concurrency: `kvgate webhook` processes, real TLS, on loopback.

    .venv/bin/python tests/benchmarks/bench_webhook.py [--replicas 2] [--concurrency 50]
        [--requests 10000] [--warmup 1000] [--runs 5] [--profile DIR]

Starts `--replicas` `kvgate webhook` processes (the command the chart runs; logs at INFO, JSON,
to /dev/null) and a small Go load generator (tests/benchmarks/webhookload, built with `go build`
first, so compiling is not measured) that plays the API server: `--concurrency` keep-alive HTTPS
connections spread round-robin over the replicas, one request in flight on each, a fresh uid per
request, and a mix of allowed, denied and allowed-with-warnings ModelDeployment CREATEs (one
third each). Every run prints p50/p90/p99/max, throughput, the webhooks' CPU per admission (user
+ system, from /proc/<pid>/stat) and the client's; the last line is the median of each over the
runs. The client shares the machine's cores with the servers, as it would not in a cluster.

--profile DIR runs each webhook under cProfile (slower; for where the time goes, not for the
latency) and prints the functions with the most time of their own.

Target (the webhook's high-availability budget): p99 <= 20 ms at 50 concurrent requests across 2
replicas. Not a test: the numbers depend on the machine and on what else runs on it."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import pstats
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "crds" / "samples" / "llama-8b.yaml"
LOAD_GENERATOR = Path(__file__).resolve().parent / "webhookload" / "main.go"
WEBHOOK_PATH = "/validate-modeldeployment"
UID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"
START_DEADLINE_SECONDS = 60.0
# `kvgate ...` under cProfile timed by CPU, not wall-clock, time (the processes share 2 cores).
PROFILED = """
import cProfile, sys, time
from kvgate.cmd.cli import main
profile = cProfile.Profile(time.process_time)
profile.enable()
try:
    main(sys.argv[1:])
finally:
    profile.disable()
    profile.dump_stats({out!r})
"""


def _reviews() -> list[dict[str, Any]]:
    """Allowed, denied (24 GiB GPUs), allowed with warnings (an unversioned image tag)."""
    safe = yaml.safe_load(SAMPLE.read_text())
    denied = copy.deepcopy(safe)
    denied["spec"]["decode"]["gpuMemoryGiB"] = 24
    warned = copy.deepcopy(safe)
    warned["spec"]["engine"]["image"] = "lmsysorg/sglang:latest"
    return [
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": UID_PLACEHOLDER,
                "kind": {"group": "kvgate.io", "version": "v1alpha1", "kind": "ModelDeployment"},
                "resource": {
                    "group": "kvgate.io",
                    "version": "v1alpha1",
                    "resource": "modeldeployments",
                },
                "requestKind": {
                    "group": "kvgate.io",
                    "version": "v1alpha1",
                    "kind": "ModelDeployment",
                },
                "name": obj["metadata"]["name"],
                "namespace": "default",
                "operation": "CREATE",
                "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": None,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
        for obj in (safe, denied, warned)
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def webhooks(
    replicas: int, tls_dir: Path, profile_dir: Path | None
) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    """`replicas` `kvgate webhook` processes on loopback, each with its URL, until exit."""
    started: list[tuple[subprocess.Popen[bytes], str, int]] = []
    try:
        for index in range(replicas):
            port, health, metrics = _free_port(), _free_port(), _free_port()
            if profile_dir is None:
                python = [sys.executable, "-m", "kvgate.cmd.cli"]
            else:
                python = [
                    sys.executable,
                    "-c",
                    PROFILED.format(out=str(profile_dir / f"webhook-{index}.prof")),
                ]
            command = [
                *python,
                "webhook",
                f"--port={port}",
                f"--health-port={health}",
                f"--metrics-port={metrics}",
                f"--tls-dir={tls_dir}",
                "--shutdown-delay-seconds=0",
            ]
            env = {**os.environ, "KVGATE_BIND_ADDRESS": "127.0.0.1", "KVGATE_LOG_FORMAT": "json"}
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
            started.append((process, f"https://127.0.0.1:{port}{WEBHOOK_PATH}", health))
        deadline = time.monotonic() + START_DEADLINE_SECONDS
        for process, _, health in started:
            while not _ready(health):
                if process.poll() is not None:
                    raise RuntimeError(f"kvgate webhook exited {process.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError("kvgate webhook did not become ready")
                time.sleep(0.1)
        yield [(process, url) for process, url, _ in started]
    finally:
        for process, _, _ in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _, _ in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def build_load_generator(directory: Path) -> Path:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("the benchmark's client is Go: install Go (https://go.dev/dl/)")
    binary = directory / "webhookload"
    subprocess.run(
        [go, "build", "-o", str(binary), str(LOAD_GENERATOR)], check=True, cwd=LOAD_GENERATOR.parent
    )
    return binary


def one_run(
    binary: Path,
    servers: list[tuple[subprocess.Popen[bytes], str]],
    ca_file: Path,
    bodies: list[Path],
    args: argparse.Namespace,
) -> dict[str, Any]:
    client = subprocess.Popen(
        [
            str(binary),
            f"-targets={','.join(url for _, url in servers)}",
            f"-ca={ca_file}",
            f"-bodies={','.join(str(b) for b in bodies)}",
            f"-concurrency={args.concurrency}",
            f"-requests={args.requests}",
            f"-warmup={args.warmup}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    warm = client.stdout.readline()
    if json.loads(warm or "{}").get("phase") != "warm":
        raise RuntimeError(f"the load generator failed during warm-up: {warm!r}")
    cpu = sum(_cpu_seconds(process.pid) for process, _ in servers)
    client.stdin.write("go\n")
    client.stdin.flush()
    result: dict[str, Any] = json.loads(client.stdout.readline())
    cpu = sum(_cpu_seconds(process.pid) for process, _ in servers) - cpu
    client.wait(timeout=30)
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} requests failed: {result['first_error']}")
    result["server_cpu_ms_per_admission"] = cpu / result["requests"] * 1000
    result["client_cpu_ms_per_admission"] = result["client_cpu_seconds"] / result["requests"] * 1000
    return result


def describe(result: dict[str, Any]) -> str:
    return (
        f"p50 {result['p50_ms']:.1f} ms, p90 {result['p90_ms']:.1f} ms, "
        f"p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms, "
        f"{result['throughput_rps']:,.0f} req/s; webhook CPU "
        f"{result['server_cpu_ms_per_admission']:.3f} ms per admission, client CPU "
        f"{result['client_cpu_ms_per_admission']:.3f} ms"
    )


def print_profile(profile_dir: Path, top: int = 30) -> None:
    files = sorted(str(path) for path in profile_dir.glob("webhook-*.prof"))
    if not files:
        print("no profile written")
        return
    stats = pstats.Stats(*files)
    print(f"\nwhere the webhooks' CPU goes (cProfile, {len(files)} processes):")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def _cpu_us(call: Any, repeat: int = 300, rounds: int = 7) -> float:
    """CPU microseconds of one call, best of `rounds` (other processes only ever add time)."""
    call()
    best = math.inf
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeat):
            call()
        best = min(best, (time.process_time() - started) / repeat * 1e6)
    return best


def _stage_times(review: dict[str, Any]) -> dict[str, float]:
    """CPU microseconds of each stage of kvgate's code for one review (in-process)."""
    from kvgate.admission import checks
    from kvgate.admission.answer import answer_review
    from kvgate.admission.policy import ClusterPolicy
    from kvgate.admission.review import check_resource, check_review, parse_review
    from kvgate.admission.schema import parse_model
    from kvgate.webhook import metrics
    from kvgate.webhook.app import HANDLER_IDS, _log_denial

    policy = ClusterPolicy()
    body = json.dumps(review).encode()
    data = parse_review(body)
    document = data["request"]["object"]
    model, _ = parse_model(document)
    assert model is not None
    answer = answer_review(data, policy)
    stages = {
        "JSON parse": _cpu_us(lambda: parse_review(body)),
        "review guard": _cpu_us(
            lambda: (
                check_review(data, "validate-modeldeployment", HANDLER_IDS),
                check_resource(data, "kvgate.io", "v1alpha1", "modeldeployments"),
            )
        ),
        "checks and answer": _cpu_us(lambda: answer_review(data, policy)),
        "JSON answer": _cpu_us(lambda: json.dumps(answer.review).encode()),
        "metrics": _cpu_us(
            lambda: (metrics.count("CREATE", answer.outcome), metrics.DURATION.observe(0.001))
        ),
    }
    if answer.outcome != "allowed":
        stages["denial log line"] = _cpu_us(lambda: _log_denial(data, answer))
    stages["total"] = sum(stages.values())
    # Inside "checks and answer":
    stages["  name and size"] = _cpu_us(
        lambda: (
            checks.check_identity(document),
            checks.check_metadata(document),
            checks.check_size(document),
        )
    )
    stages["  schema (pydantic)"] = _cpu_us(lambda: parse_model(document))
    for check in checks.CHECKS:
        stages[f"  {check.__name__}"] = _cpu_us(lambda check=check: check(model.spec, policy))
    return stages


def print_breakdown() -> None:
    """Where an admission's CPU goes inside kvgate's code, per review of the mix, in-process
    (what is left of the measured webhook CPU is aiohttp, uvloop, TLS and the sockets)."""
    import logging

    from kvgate.webhook.webhook_command import JsonFormatter

    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    handler.setFormatter(JsonFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger("kvgate").setLevel(logging.INFO)
    print("\nCPU per admission in kvgate's own code (in-process, best of 7, microseconds):")
    for label, review in zip(("allowed", "denied", "warned"), _reviews(), strict=True):
        stages = _stage_times(review)
        parts = ", ".join(f"{name.strip()} {us:.0f}" for name, us in stages.items())
        print(f"  {label}: {parts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--requests", type=int, default=10_000, help="measured, per run")
    parser.add_argument("--warmup", type=int, default=1_000, help="per run, not measured")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--breakdown", action="store_true", help="also time kvgate's stages in-process"
    )
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "operator"))
    from kvgate.kube.tls import make_ca, make_serving_cert, write_tls_dir

    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        files = write_tls_dir(directory / "tls", make_serving_cert(make_ca()))
        bodies = []
        for index, body in enumerate(_reviews()):
            path = directory / f"review-{index}.json"
            path.write_text(
                json.dumps(body)
            )  # Go's encoding/json is compact too; sizes differ little
            bodies.append(path)
        binary = build_load_generator(directory)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        results = []
        with webhooks(args.replicas, directory / "tls", args.profile) as servers:
            print(
                f"{args.replicas} kvgate webhook processes, {args.concurrency} keep-alive "
                f"connections, {args.requests:,} requests per run after {args.warmup:,} "
                f"unmeasured; {os.cpu_count()} cores shared by the webhooks and the Go client"
            )
            for run in range(1, args.runs + 1):
                load = Path("/proc/loadavg").read_text().split()[0]
                result = one_run(binary, servers, files.ca_file, bodies, args)
                results.append(result)
                print(
                    f"run {run}: {describe(result)}; answers {result['answers']}; load "
                    f"average before the run {load}"
                )
    median = {
        key: statistics.median(r[key] for r in results)
        for key in (
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "max_ms",
            "throughput_rps",
            "server_cpu_ms_per_admission",
            "client_cpu_ms_per_admission",
        )
    }
    print(f"median of {len(results)} runs: {describe(median)}")
    if args.profile is not None:
        print_profile(args.profile)
    if args.breakdown:
        print_breakdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
