"""The README's quick start on the e2e cluster, as a user types it: the chart installed (the world
installs it, ``helm install kvgate charts/kvgate --namespace kvgate-system``), ``kvgate validate``
of a first ModelDeployment, ``kubectl apply``, and the refusal read with the kubectl plugin
(``kubectl kvgate explain``), whose smallest change, applied, makes it Ready; then ``kubectl
kvgate history`` and ``rollback`` on it.

The first ModelDeployment is the sample on the 24 GiB pool without ``gpuMemoryGiB`` (admission
cannot estimate it): the live engines report a pool below its 131,072-token context and the
rollout is refused. The plugin is the installed ``kubectl-kvgate`` script (``pip install`` of the
repository; kubectl runs ``kubectl-<name>`` from PATH), run by the world's own kubectl with the
world's kubeconfig in ``KUBECONFIG``, as a user's shell would.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_quick_start.py -v -s`` (root).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.world import OPERATOR_NAMESPACE, RELEASE, SMALL_POOL, World
from plugin_helpers import BIN, kubectl_kvgate, plugin_directory
from scenario_helpers import on_pool_without_estimate, refused_with, sample_md, wait_md_ready

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

MD = "first-model"
CONTEXT = 131_072


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plugin_directory(tmp_path_factory.mktemp("plugin"))


def test_the_quick_start_reads_a_refusal_with_kubectl_kvgate_and_its_fix_makes_it_ready(
    world: World, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    ns = namespace
    # helm install kvgate charts/kvgate --namespace kvgate-system --create-namespace
    release = json.loads(
        world.helm("status", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "-o", "json")
    )
    assert release["info"]["status"] == "deployed", release["info"]

    # kvgate validate crds/samples/llama-8b.yaml, for the first ModelDeployment
    md = on_pool_without_estimate(sample_md(MD), SMALL_POOL)
    manifest = tmp_path / f"{MD}.yaml"
    manifest.write_text(yaml.safe_dump(md))
    validated = subprocess.run(
        [str(BIN / "kvgate"), "validate", str(manifest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr

    # kubectl apply -f ...; it is refused: the live pools are below the context
    assert "created" in world.apply(md, namespace=ns)
    refused_with(world, ns, MD, "KvPoolTooSmall")

    # kubectl kvgate explain: why, with the numbers, and the smallest change
    explained = kubectl_kvgate(world, plugin_dir, "explain", MD, "-n", ns)
    assert explained.returncode == 1, explained.stderr
    assert f"{MD} in {ns}: not Ready (RolloutRefused)" in explained.stdout
    assert "KvPoolTooSmall" in explained.stdout and "short by" in explained.stdout
    assert "lower spec.model.contextLength to" in explained.stdout
    as_json = kubectl_kvgate(world, plugin_dir, "explain", MD, "-n", ns, "--json")
    document: dict[str, Any] = json.loads(as_json.stdout)
    assert (document["schemaVersion"], document["command"], document["exit_code"]) == (
        1,
        "explain",
        1,
    )
    pools = {role: live["kv_pool_tokens"] for role, live in document["roles"].items()}
    known = [pool for pool in pools.values() if pool is not None]
    assert known and all(pool < CONTEXT for pool in known), pools
    # The number is the live engine's own, as the refusal in the status wrote it.
    refusal = document["refusal"]["message"]
    assert any(f"KV pool {pool:,} tokens" in refusal for pool in known), (pools, refusal)
    fix = next(c for c in document["changes"] if c["field"] == "spec.model.contextLength")
    assert fix["value"] == min(known), (fix, pools)
    print(f"MEASURED live pools {pools}; the fix: contextLength {fix['value']:,}")

    # kubectl kvgate history / rollback: one refused revision, nothing to roll back to
    history = kubectl_kvgate(world, plugin_dir, "history", MD, "-n", ns, "--json")
    assert history.returncode == 0
    (refused,) = json.loads(history.stdout)["revisions"]
    assert refused["outcome"] == "refused" and refused["refusal"]["reason"] == "EngineUnsafe"
    nothing = kubectl_kvgate(world, plugin_dir, "rollback", MD, "-n", ns)
    assert nothing.returncode == 2 and "no earlier revision" in nothing.stderr

    # Apply the fix explain named: the same engines now hold the advertised context.
    md["spec"]["model"]["contextLength"] = fix["value"]
    assert "configured" in world.apply(md, namespace=ns)
    wait_md_ready(world, MD, ns, 240, f"{MD} Ready at contextLength {fix['value']:,}")
    ready = kubectl_kvgate(world, plugin_dir, "explain", MD, "-n", ns)
    assert ready.returncode == 0 and f"{MD} in {ns}: Ready (RevisionServing)" in ready.stdout

    # The refused revision cannot be rolled back to; history shows both.
    again = kubectl_kvgate(
        world, plugin_dir, "rollback", MD, "-n", ns, "--to-revision", refused["revision"]
    )
    assert again.returncode == 2 and "was refused" in again.stderr
    both = json.loads(kubectl_kvgate(world, plugin_dir, "history", MD, "-n", ns, "--json").stdout)
    outcomes = {row["revision"]: row["outcome"] for row in both["revisions"]}
    assert outcomes[refused["revision"]] == "refused", outcomes
    assert sorted(outcomes.values()) == ["refused", "serving"], outcomes
    # The spec has moved on; the refusal is still kvgate's record (status.refusals), no Event's.
    earlier = next(row for row in both["revisions"] if row["revision"] == refused["revision"])
    assert earlier["refusal"] == refused["refusal"], (earlier, refused)
    recorded = world.get_md(MD, ns)
    assert recorded is not None
    assert [r["revision"] for r in recorded["status"]["refusals"]] == [refused["revision"]]
