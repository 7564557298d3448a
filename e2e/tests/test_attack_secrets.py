"""The secrets an engine's ``/server_info`` carries never leave through kvgate.

SGLang's ``/server_info`` answers with every flag it was started with: ``api_key``,
``admin_api_key``, ``ssl_keyfile_password``, again in each DP rank's state, and (since 0.5.20) in
``launch_command`` (upstream sgl-project/sglang#37457). kvgate reads that document on every
verification, so each place kvgate writes or prints to is read here, for an engine started with
all three, and none may hold one of them.

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -m e2e e2e/tests/test_attack_secrets.py -s``
(root).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

# Deadlines, not bounds (kvgate_e2e.deadlines); the first revision Ready was 240 s here.
from kvgate_e2e.deadlines import REVISION_DEADLINE
from kvgate_e2e.world import World, http_json
from scenario_helpers import (
    GATE,
    engine_pods,
    events,
    make_tenant,
    operator_metrics,
    sample_md,
    wait_md_ready,
)

pytestmark = pytest.mark.e2e

MD = "keyed"
SECRET = "engine-keys"
CONTEXT = 131_072
KVGATE = Path(sys.executable).parent / "kvgate"
KVGATE_CLI_TIMEOUT = 120  # one kvgate command (verify against an engine, explain): seconds


def keyed_md(api_key_ref: dict[str, str]) -> dict[str, Any]:
    """The safe sample with an engine API key from the Secret (spec.engine.apiKeySecretRef), an
    admin key and an SSL key password from the same Secret through variables, as admission
    asks for them (never a literal value in spec.engine.args)."""
    md = sample_md(MD)
    engine = md["spec"]["engine"]
    engine["apiKeySecretRef"] = api_key_ref
    engine["env"] = [
        {"name": "ADMIN_KEY", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "admin"}}},
        {"name": "SSL_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "ssl"}}},
    ]
    engine["args"] = [
        *("--admin-api-key", "$(ADMIN_KEY)"),
        *("--ssl-keyfile-password", "$(SSL_PASSWORD)"),
    ]
    return md


def kvgate(*args: str) -> str:
    """``kvgate ARGS`` as a user runs it, which must exit 0 (safe; Ready); its stdout and stderr
    together."""
    done = subprocess.run(
        [str(KVGATE), *args],
        capture_output=True,
        text=True,
        timeout=KVGATE_CLI_TIMEOUT,
        check=False,
    )
    print(f"$ kvgate {' '.join(args[:3])} ... (exit {done.returncode})\n{done.stdout[:600]}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def container_log(world: World, namespace: str, pod: str, container: str) -> str:
    path = world.kubelet.kubelet.log_path(namespace, pod, container)
    assert path is not None and path.exists(), f"no log of {namespace}/{pod} {container}"
    return path.read_text(errors="replace")


def test_the_secrets_an_engine_reports_in_server_info_appear_in_nothing_kvgate_writes_or_prints(
    world: World, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    keys = {name: f"e2e-{name}-{secrets.token_hex(12)}" for name in ("api", "admin", "ssl")}
    tenant = make_tenant(world, ns)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "stringData": keys,
    }
    md = keyed_md({"name": SECRET, "key": "api"})
    for manifest in (secret, md):
        applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
        assert applied.returncode == 0, applied.stderr
    wait_md_ready(world, MD, ns, REVISION_DEADLINE)

    # The engines report all three secrets, as SGLang does: what kvgate reads holds them.
    pods = engine_pods(world, ns, MD)
    assert sorted(p["metadata"]["labels"]["kvgate.io/role"] for p in pods) == ["decode", "prefill"]
    saved: dict[str, Path] = {}
    for pod in pods:
        url = world.engine_url(pod)
        assert http_json(f"{url}/server_info")[0] == 401  # the key guards it
        status, info = http_json(
            f"{url}/server_info", headers={"Authorization": f"Bearer {keys['api']}"}
        )
        assert status == 200, info
        assert info["api_key"] == keys["api"] and info["admin_api_key"] == keys["admin"]
        assert info["ssl_keyfile_password"] == keys["ssl"]
        assert all(key in info["launch_command"] for key in keys.values())
        role = pod["metadata"]["labels"]["kvgate.io/role"]
        saved[role] = tmp_path / f"{role}-server_info.json"
        saved[role].write_text(json.dumps(info))  # what a user saves with curl

    # Everything kvgate wrote or prints about these engines.
    outputs: dict[str, str] = {
        "ModelDeployment": json.dumps(world.get_md(MD, ns)),
        "pods (gate conditions)": json.dumps(world.list("pods", ns)),
        "Events": json.dumps(events(world, ns)),
        "operator log": world.operator_log(1_000_000),
        "operator /metrics": operator_metrics(world),
        "operator task dump": world.operator_tasks(),
    }
    gates = [c for p in world.list("pods", ns) for c in p["status"].get("conditions", [])]
    assert sum(c["type"] == GATE and c["status"] == "True" for c in gates) == 2, gates
    for pod in pods:
        name, role = pod["metadata"]["name"], pod["metadata"]["labels"]["kvgate.io/role"]
        outputs[f"guard log {role}"] = container_log(world, ns, name, "kvgate-guard")
        url = world.engine_url(pod)
        common = ("--context-length", str(CONTEXT), "--role", role)
        for json_flag in ((), ("--json",)):
            live = kvgate("verify", "--url", url, "--api-key", keys["api"], *common, *json_flag)
            offline = kvgate("verify", "--server-info", str(saved[role]), *common, *json_flag)
            outputs[f"kvgate verify --url {role} {json_flag}"] = live
            outputs[f"kvgate verify --server-info {role} {json_flag}"] = offline
    kubeconfig = str(world.cluster.host_kubeconfig)
    for json_flag in ((), ("--json",)):
        explained = kvgate("explain", MD, "-n", ns, "--kubeconfig", kubeconfig, *json_flag)
        outputs[f"kvgate explain {json_flag}"] = explained

    leaks = [
        f"{where}: the {name} secret"
        for where, text in outputs.items()
        for name, key in keys.items()
        if key in text
    ]
    sizes = {where: len(text) for where, text in outputs.items()}
    print(f"MEASURED {len(outputs)} outputs read, {sum(sizes.values()):,} characters: {sizes}")
    assert not leaks, leaks


def test_an_engine_admin_key_without_an_api_key_is_denied_since_the_router_would_serve_it(
    world: World, namespace: str
) -> None:
    # SGLang opens its ordinary routes when it has an admin key and no API key, /server_info
    # among them, and smg forwards GET /get_server_info to a worker: through the <md> Service
    # anyone would read the admin key (measured before this was denied).
    tenant = make_tenant(world, namespace)
    admin = f"e2e-admin-{secrets.token_hex(12)}"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "stringData": {"admin": admin, "ssl": "unused"},
    }
    assert tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(secret)).returncode == 0
    md = keyed_md({"name": SECRET, "key": "admin"})
    del md["spec"]["engine"]["apiKeySecretRef"]
    applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(md))
    print(f"DENIED: {applied.stderr.strip()}")
    assert applied.returncode != 0, f"admitted:\n{applied.stdout}"
    for phrase in (
        "spec.engine.args[0]: --admin-api-key",
        "spec.engine.args[2]: --ssl-keyfile-password",
        "spec.engine.apiKeySecretRef",
    ):
        assert phrase in applied.stderr, applied.stderr
    assert admin not in applied.stderr
    assert world.get_md(MD, namespace) is None
