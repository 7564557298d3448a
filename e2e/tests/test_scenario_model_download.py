"""Weights downloaded at pod start (``spec.model.source.download``) from a hub inside the world.

Nothing here reaches a real hub, so a pod of the world runs a local one that speaks the Hugging
Face Hub API (``kvgate_e2e.model_hub``: the file listing, ``resolve`` with a CDN-style redirect
for LFS files, ``Range``, the hub's 401) for a tiny repository: the reference engine's
Llama-3.1-8B config.json, a tokenizer.json and a 16 MiB model.safetensors, behind a token. A
ModelDeployment (the safe sample) downloads it into each engine pod's emptyDir with the init
container ``kvgate-fetch-model`` (kvgate's image, ``kvgate fetch-model``), the token from a Secret:

1. with a wrong token in the Secret, each engine pod stays in its init phase: the download
   exits 1, its log names the repository, the Secret and the fix and never the token, and the
   ModelDeployment is not Ready;
2. with the right token put in the Secret, the init container's next try (the kubelet's
   back-off) downloads the snapshot (its log: each file checked, the size, time and rate); the
   reference engines start on ``/models/kvgate-tiny`` (without the downloaded config.json they
   exit: no bundled config matches that name), are verified, and a known-answer request through
   the router is answered.

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s e2e/tests/test_scenario_model_download.py``
(root). Prints ``MEASURED`` lines.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import EVENT_DEADLINE, PASS_DEADLINE, REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.model_hub import HubState
from kvgate_e2e.world import BIG_POOL, World, is_ready
from scenario_helpers import (
    deadline_loop,
    engine_pods,
    events,
    md_condition,
    md_story,
    sample_md,
    server_info,
    wait_known_answer,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

REPO = "kvgate-e2e/tiny-llama"
MODEL_DIR = "/models/kvgate-tiny"
TOKEN = "hf_e2e-hub-token-that-must-never-be-logged"
WRONG_TOKEN = "hf_e2e-wrong-token-also-never-logged"
HUB_PORT = 8080
FETCH = "kvgate-fetch-model"
BUNDLED_CONFIG = (
    Path(__file__).resolve().parents[2]
    / "engine"
    / "kvgate_engine"
    / "reference"
    / "models"
    / "llama-3.1-8b"
    / "config.json"
)
WEIGHTS_BYTES = 16 * 2**20
# Deadlines, not bounds (the run prints the time to Ready once the token is fixed): only a step
# that never happens reaches one. Shared ones come from kvgate_e2e.deadlines.
HUB_READY_DEADLINE = 120  # the model hub pod (python:3.11 serving the repository) Ready
# Both engine pods scheduled and their download init container run and failed (exit 1) on the
# wrong token.
DOWNLOAD_FAILED_DEADLINE = 180
FETCH_LOG_DEADLINE = 30  # the failed init container's log readable through the kubelet


def make_repository(root: Path) -> str:
    """The tiny repository under ``root``; its commit as the hub names it."""
    repo = root / REPO
    repo.mkdir(parents=True)
    (repo / "config.json").write_bytes(BUNDLED_CONFIG.read_bytes())
    (repo / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    # Not a real checkpoint (the reference engine reads only config.json); large enough that
    # the download has several chunks, an LFS checksum and a CDN redirect.
    (repo / "model.safetensors").write_bytes(bytes(range(256)) * (WEIGHTS_BYTES // 256))
    state = HubState(root)
    return state.commit(state.files(repo))


def secret(name: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }


def hub_pod(root: Path) -> dict[str, Any]:
    """The hub, serving ``root`` on its pod IP, requiring the token of Secret hub-server-token."""
    container = {
        "name": "hub",
        "image": "python:3.11",
        "command": [
            "python3",
            "-m",
            "kvgate_e2e.model_hub",
            "--root",
            "/hub",
            "--host",
            "$(POD_IP)",
            "--port",
            str(HUB_PORT),
            "--token-file",
            "/token/token",
        ],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": HUB_PORT}],
        "readinessProbe": {"tcpSocket": {"port": HUB_PORT}, "periodSeconds": 1},
        "volumeMounts": [
            {"name": "repositories", "mountPath": "/hub", "readOnly": True},
            {"name": "token", "mountPath": "/token", "readOnly": True},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "model-hub", "labels": {"app": "model-hub"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            "volumes": [
                {"name": "repositories", "hostPath": {"path": str(root), "type": "Directory"}},
                {"name": "token", "secret": {"secretName": "hub-server-token"}},
            ],
        },
    }


def download_md(name: str, endpoint: str, commit: str) -> dict[str, Any]:
    md = sample_md(name, BIG_POOL)
    md["spec"]["model"]["path"] = MODEL_DIR
    md["spec"]["model"]["source"] = {
        "download": {
            "repo": REPO,
            "revision": commit,
            "endpoint": endpoint,
            "tokenSecretRef": {"name": "hub-token", "key": "token"},
            # Room for the sample's declared 15 GiB of weights (admission checks it).
            "storage": {"emptyDir": {"sizeLimit": "20Gi"}},
        }
    }
    return md


def fetch_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return next((s for s in statuses if s["name"] == FETCH), None)


def fetch_log(world: World, namespace: str, pod: str) -> str:
    """The log of the download container's last instance that ended: the current one once it
    has terminated, else the one before it (``--previous``, while the kubelet has already started
    the next try); "" while no instance has ended. Reading the running instance instead gave only
    its first line (seen in a make test: the next try had started when the log was read)."""
    found = world.get("pod", pod, namespace)
    status = fetch_status(found) if found else None
    if status is None:
        return ""
    if (status.get("state") or {}).get("terminated"):
        previous: tuple[str, ...] = ()
    elif (status.get("lastState") or {}).get("terminated"):
        previous = ("--previous",)
    else:
        return ""
    done = world.kubectl(
        "logs", pod, "-c", FETCH, f"--namespace={namespace}", *previous, check=False
    )
    return str(done.stdout) if done.returncode == 0 else ""


def test_weights_are_downloaded_at_pod_start_with_the_token_from_a_secret(
    world: World, namespace: str, tmp_path: Path
) -> None:
    root = tmp_path / "hub"
    commit = make_repository(root)
    world.apply(secret("hub-server-token", TOKEN), namespace)
    world.apply(secret("hub-token", WRONG_TOKEN), namespace)
    world.apply(hub_pod(root), namespace)
    hub = deadline_loop(
        "the model hub pod to be Ready",
        lambda: (p := world.get("pod", "model-hub", namespace)) is not None and is_ready(p) and p,
        HUB_READY_DEADLINE,
    )
    endpoint = f"http://{hub['status']['podIP']}:{HUB_PORT}"

    # 1. A wrong token: each engine pod's download fails, says why, and nothing starts.
    applied = world.kubectl(
        "apply",
        f"--namespace={namespace}",
        "-f",
        "-",
        input=json.dumps(download_md("fetched", endpoint, commit)),
    )
    print(applied.stderr)  # admission's warning: a token over plain http
    assert "travels unencrypted" in applied.stderr, applied.stderr

    def failed_downloads() -> list[dict[str, Any]] | None:
        pods = engine_pods(world, namespace, "fetched")
        failed = [
            p
            for p in pods
            if (s := fetch_status(p))
            and (
                (s.get("state") or {}).get("terminated", {}).get("exitCode") == 1
                or (s.get("lastState") or {}).get("terminated", {}).get("exitCode") == 1
            )
        ]
        return failed if len(pods) == 2 and len(failed) == 2 else None

    pods = deadline_loop(
        "both engine pods' downloads to fail on the wrong token",
        failed_downloads,
        DOWNLOAD_FAILED_DEADLINE,
        details=lambda: md_story(world, "fetched", namespace),
    )
    for pod in pods:
        name = pod["metadata"]["name"]
        log = deadline_loop(
            f"{name}'s download log",
            lambda n=name: fetch_log(world, namespace, n),
            FETCH_LOG_DEADLINE,
        )
        print(f"--- {name} {FETCH} (wrong token):\n{log}")
        assert f"answered 401 (RepoNotFound) for repository {REPO}" in log, log
        assert "the token from Secret hub-token key token is not accepted" in log, log
        assert TOKEN not in log and WRONG_TOKEN not in log
        assert pod["status"].get("phase") == "Pending" and not is_ready(pod)
    md = world.get_md("fetched", namespace)
    assert md is not None and not is_ready(md)
    # ... and the ModelDeployment says so, in the download's own words, with one Warning Event.
    engines = deadline_loop(
        "the ModelDeployment to say the model download fails, with its log line",
        lambda: (
            (c := md_condition(world, "fetched", namespace, "EnginesVerified"))
            and c["reason"] == "ModelDownloadFailing"
            and "answered 401 (RepoNotFound)" in c["message"]
            and c
        ),
        PASS_DEADLINE,
        details=lambda: md_story(world, "fetched", namespace),
    )
    print(f"EnginesVerified: {engines['message']}")
    assert "the token from Secret hub-token key token is not accepted" in engines["message"]
    assert f"-c {FETCH}" in engines["message"] and "exited 1" in engines["message"]
    assert TOKEN not in engines["message"] and WRONG_TOKEN not in engines["message"]
    progressing = md_condition(world, "fetched", namespace, "Progressing")
    assert progressing is not None and "the model download failed" in progressing["message"]
    warned = deadline_loop(
        "a ModelDownloadFailing Event",
        lambda: events(world, namespace, "ModelDownloadFailing"),
        EVENT_DEADLINE,
    )
    assert all(e["type"] == "Warning" and TOKEN not in e["message"] for e in warned), warned

    # 2. The right token: the next try downloads, the engines start on the weights and serve.
    fixed = time.monotonic()
    world.apply(secret("hub-token", TOKEN), namespace)
    wait_md_ready(world, "fetched", namespace, REVISION_DEADLINE)
    ready_after = time.monotonic() - fixed
    engines_now = md_condition(world, "fetched", namespace, "EnginesVerified")
    assert engines_now is not None and engines_now["reason"] == "AllEnginesVerified", engines_now
    assert len(events(world, namespace, "ModelDownloadFailing")) == len(warned)  # no repeats
    wait_known_answer(world, "fetched", namespace, STEP_DEADLINE)
    for pod in engine_pods(world, namespace, "fetched"):
        name = pod["metadata"]["name"]
        log = fetch_log(world, namespace, name)
        print(f"--- {name} {FETCH}:\n{log}")
        assert f"{REPO} at {commit}" in log and f"commit {commit}" in log, log
        assert "model.safetensors: 16.0 MiB" in log and "(size and SHA-256 checked)" in log, log
        assert "downloaded 3 of 3 files" in log and "MiB/s" in log, log
        assert TOKEN not in log and WRONG_TOKEN not in log
        status = fetch_status(pod)
        assert status is not None
        assert status["state"]["terminated"]["exitCode"] == 0, status
        info = server_info(world.engine_url(pod))
        assert info is not None and info["model_path"] == MODEL_DIR, info
        rate = next(line for line in log.splitlines() if "downloaded 3 of 3" in line)
        print(f"MEASURED {name}: {rate.split(': ', 1)[1]}")
    print(f"MEASURED right token in the Secret -> ModelDeployment Ready: {ready_after:.1f}s")
