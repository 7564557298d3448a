"""A tenant who holds the router key registers a worker whose URL kvgate and smg read as two
different hosts: ``http://<rogue>:30000\\@<verified decode>:30000``. Python's ``urlsplit`` reads
the verified decode's address (after the ``@``); smg reads it the WHATWG way, where ``\\`` ends
the authority, and connects to the rogue. kvgate must judge the URL as smg reads it, or accept
only the exact form smg's discovery writes; anything else is removed.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_worker_url.py -v -s`` (root).
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import MD, MODEL, serve

# Deadlines, not bounds (the run prints the time the removal took): kvgate_e2e.deadlines.
from kvgate_e2e.deadlines import (
    ENGINE_POD_DEADLINE,
    HTTP_GET_TIMEOUT,
    ROUTER_API_TIMEOUT,
    ROUTER_AUDIT_DEADLINE,
)
from kvgate_e2e.sampler import InvariantSampler, smg_host
from kvgate_e2e.world import World, http_json, is_ready
from scenario_helpers import deadline_loop, events, known_answer, router_workers

pytestmark = pytest.mark.e2e

ROGUE_PORT = 30001
REQUESTS = 20
SERVER = Path(__file__).with_name("rogue_server.py")


def any_path_rogue() -> dict[str, Any]:
    """The tenant's own engine (no kvgate labels, a 2,048-token pool under a 131,072-token
    window), answering SGLang's API on any path prefix (rogue_server.py)."""
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PORT", "value": str(ROGUE_PORT)},
        {"name": "MODEL", "value": MODEL},
    ]
    container = {
        "name": "engine",
        "image": "python:3.11",
        "command": ["python3", "-c", SERVER.read_text()],
        "env": env,
        "ports": [{"name": "http", "containerPort": ROGUE_PORT}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": ROGUE_PORT}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rogue", "labels": {"app": "rogue"}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
    }


def received(world: World, rogue: dict[str, Any]) -> int:
    """Generation requests the rogue has received (each a client's prompt)."""
    url = f"{world.engine_url(rogue, ROGUE_PORT)}/rogue/requests"
    code, body = http_json(url, timeout=HTTP_GET_TIMEOUT)
    assert code == 200, body
    return int(body["requests"])


def test_a_worker_url_smg_reads_as_another_host_is_removed_and_the_rogue_serves_nothing(
    world: World, namespace: str
) -> None:
    s = serve(world, namespace)
    created = s.tenant.create(any_path_rogue())
    assert created.returncode == 0, created.stderr
    rogue = deadline_loop(
        "the tenant's rogue engine to be Ready",
        lambda: (p := world.get("pod", "rogue", namespace)) is not None and is_ready(p) and p,
        ENGINE_POD_DEADLINE,
    )
    rogue_ip, decode_ip = rogue["status"]["podIP"], s.decode["status"]["podIP"]
    disguised = f"http://{rogue_ip}:{ROGUE_PORT}\\@{decode_ip}:30000"
    assert smg_host(disguised) == rogue_ip  # where smg sends its traffic

    # A namespace editor may read the router's key (the threat model accepts it).
    read = s.tenant.kubectl(
        "get", "secret", f"{MD}-router-control", "-o", "jsonpath={.data.admin-key}"
    )
    assert read.returncode == 0, read.stderr
    key = base64.b64decode(read.stdout).decode()
    before = received(world, rogue)

    with InvariantSampler(world.cluster, namespace, name="disguised-worker") as sampler:
        posted = time.monotonic()
        code, answer = http_json(
            world.service_url(MD, namespace) + "/workers",
            {"url": disguised, "worker_type": "decode"},
            timeout=ROUTER_API_TIMEOUT,
            headers={"Authorization": f"Bearer {key}"},
        )
        print(f"POST /workers {disguised!r} with the key: HTTP {code} {answer}")
        assert code == 202, answer

        worker_id = answer["worker_id"]
        seen_as: set[str] = set()

        def removed() -> float | None:
            listed = {str(w.get("id")): w for w in router_workers(world, namespace, MD)}
            if worker_id in listed:
                seen_as.add(str(listed[worker_id].get("url")))
            announced = any(
                e.get("reason") == "UnknownWorkerRemoved" and worker_id in e.get("message", "")
                for e in events(world, namespace)
            )
            return time.monotonic() - posted if announced and worker_id not in listed else None

        try:
            took = deadline_loop(
                "kvgate to remove the disguised worker", removed, ROUTER_AUDIT_DEADLINE
            )
        finally:
            print(f"smg listed the worker as {sorted(seen_as)}")
        print(
            f"MEASURED disguised worker removed {took:.2f} s after POST /workers (smg listed it "
            f"as {sorted(seen_as)}); the rogue received {received(world, rogue) - before} "
            "request(s) meanwhile"
        )
        event = next(
            e
            for e in events(world, namespace, "UnknownWorkerRemoved")
            if worker_id in e.get("message", "")
        )
        print(f"Event {event['reason']}: {event['message']}")
        assert "not http://<pod IP>:<port> as smg's discovery writes it" in event["message"]

        # From then on every request is answered by the verified pair, none by the rogue.
        at_removal = received(world, rogue)
        for _ in range(REQUESTS):
            ok, why = known_answer(world, MD, namespace)
            assert ok, why
        assert worker_id not in [w.get("id") for w in router_workers(world, namespace, MD)]
        after = received(world, rogue) - at_removal
        print(f"MEASURED the rogue received {after} of {REQUESTS} requests after the removal")
        assert after == 0
    assert sampler.violations == [], sampler.summary()
