"""A tenant's Events against the kubectl plugin: ``edit`` may create Events, with any reason,
message and reporter. On a serving ModelDeployment the tenant creates a ``RolloutRefused`` and a
``RollbackStarted`` Event that name a revision that never existed and claim kvgate as their
source; ``kubectl kvgate history``, ``explain`` and ``rollback``, run with the tenant's own
token, must state as kvgate's record only what kvgate wrote (the ModelDeployment's status), and
show Events, if at all, as Events with the reporter they claim.

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s -m e2e
e2e/tests/test_attack_plugin_record.py`` (root).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.world import World
from plugin_helpers import kubectl_kvgate, plugin_directory, service_account_kubeconfig
from scenario_helpers import events, make_tenant, sample_md, wait_md_ready

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

MD = "recorded"
FORGED = "1fa11ed0aa"  # a revision kvgate never computed: hex, as the plugin's input rule wants
FORGED_REFUSAL = "decode pod recorded-1fa11ed0aa-decode-0 reports KV pool 2,048 tokens"
FORGED_ROLLBACK = "rolling back to revision 1fa11ed0aa"
# How long the sample takes to serve on a loaded machine (it serves in about 20 s alone).
READY_DEADLINE_S = 240


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plugin_directory(tmp_path_factory.mktemp("plugin"))


def forged_event(
    md: dict[str, Any], name: str, type_: str, reason: str, message: str
) -> dict[str, Any]:
    """A core/v1 Event on ``md`` that looks like one kvgate writes (``kvgate.kube.k8s``'s
    ``post_event``), reporter fields included."""
    meta = md["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{name}"},
        "involvedObject": {
            "apiVersion": md["apiVersion"],
            "kind": "ModelDeployment",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": "kvgate"},
        "reportingComponent": "kvgate",
        "reportingInstance": "kvgate-operator",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def test_events_a_tenant_forges_are_never_stated_or_used_as_kvgates_record(
    world: World, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    ns = namespace
    tenant = make_tenant(world, ns)
    world.apply(sample_md(MD), ns)
    served = wait_md_ready(world, MD, ns, READY_DEADLINE_S)
    serving = served["status"]["servingRevision"]
    as_tenant = service_account_kubeconfig(world, ns, "tenant", tmp_path / "tenant.kubeconfig")

    refused = forged_event(
        served,
        "forged-refusal",
        "Warning",
        "RolloutRefused",
        f"revision {FORGED} refused (EngineUnsafe): {FORGED_REFUSAL} < context length 131,072 "
        f"× headroom 1.0; revision {serving} keeps serving",
    )
    rollback = forged_event(
        served,
        "forged-rollback",
        "Normal",
        "RollbackStarted",
        f"{FORGED_ROLLBACK}, which served from 2026-11-01T10:00:00Z: its spec is restored and its "
        "engines are verified before it takes traffic",
    )
    for event in (refused, rollback):
        created = tenant.create(event)
        assert created.returncode == 0, created.stderr  # edit may create Events
    stored = {e["metadata"]["name"]: e for e in events(world, ns)}
    assert stored[f"{MD}.forged-refusal"]["source"]["component"] == "kvgate", stored

    # kubectl kvgate history: the one revision kvgate recorded, nothing the Events name.
    history = kubectl_kvgate(world, plugin_dir, "history", MD, "--json", kubeconfig=as_tenant)
    assert history.returncode == 0, history.stderr
    rows = [
        (row["number"], row["revision"], row["outcome"])
        for row in json.loads(history.stdout)["revisions"]
    ]
    assert rows == [(1, serving, "serving")], rows
    text = kubectl_kvgate(world, plugin_dir, "history", MD, kubeconfig=as_tenant)
    assert text.returncode == 0 and serving in text.stdout, text.stderr
    assert FORGED not in text.stdout, text.stdout

    # kubectl kvgate explain: Ready, no refusal; the forged text only as an Event, labelled
    # with the reporter it claims.
    explained = kubectl_kvgate(world, plugin_dir, "explain", MD, kubeconfig=as_tenant)
    assert explained.returncode == 0, explained.stdout + explained.stderr
    lines = explained.stdout.splitlines()
    assert lines[0] == f"{MD} in {ns}: Ready (RevisionServing)", lines[0]
    heading = next(i for i, line in enumerate(lines) if line.startswith("Events "))
    assert "not kvgate's record" in lines[heading], lines[heading]
    forged_lines = [line for line in lines if FORGED in line]
    assert len(forged_lines) == 2, explained.stdout
    assert all(lines.index(line) > heading for line in forged_lines), explained.stdout
    assert all("reported as kvgate/kvgate-operator" in line for line in forged_lines)
    document = json.loads(
        kubectl_kvgate(world, plugin_dir, "explain", MD, "--json", kubeconfig=as_tenant).stdout
    )
    assert (document["refusal"], document["refused_revision"]) == (None, None), document
    assert document["serving_revision"] == document["target_revision"] == serving, document
    reporters = {e["reason"]: e["reporter"] for e in document["events"] if FORGED in e["message"]}
    assert reporters == {
        "RolloutRefused": "kvgate/kvgate-operator",
        "RollbackStarted": "kvgate/kvgate-operator",
    }, document["events"]

    # kubectl kvgate rollback: neither the forged revision nor a row it would have made.
    for asked in (FORGED, "2"):
        answer = kubectl_kvgate(
            world, plugin_dir, "rollback", MD, "--to-revision", asked, kubeconfig=as_tenant
        )
        assert answer.returncode == 2, answer.stdout + answer.stderr
        assert f"there is no revision {asked}" in answer.stderr, answer.stderr
        assert FORGED_REFUSAL not in answer.stderr, answer.stderr
    after = world.get_md(MD, ns)
    assert after is not None
    annotations = after["metadata"].get("annotations") or {}
    assert "kvgate.io/rollback" not in annotations, annotations
    assert after["status"]["servingRevision"] == serving, after["status"]
