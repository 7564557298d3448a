"""The README's quick start on the e2e cluster, as a user types it: the chart installed (the world
installs it, ``helm install kvgate charts/kvgate --namespace kvgate-system``), ``kvgate validate``
of a first ModelDeployment, ``kubectl apply``, and the refusal read with the kubectl plugin
(``kubectl kvgate explain``), whose smallest change, applied, makes it Ready; a chat request and
a ``/generate`` request through the Service its ``status.url`` names; then ``kubectl kvgate
history`` and ``rollback`` on it. On the way, ``kubectl get kvmd`` (the short name) and
``kubectl get kvgate`` (the category of both kinds).

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
from urllib.parse import urlsplit

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason

# Deadlines, not bounds (kvgate_e2e.deadlines); the first revision Ready was 240 s here.
from kvgate_e2e.deadlines import GENERATE_TIMEOUT, REVISION_DEADLINE
from kvgate_e2e.world import (
    KNOWN_PROMPT_IDS,
    OPERATOR_NAMESPACE,
    RELEASE,
    SMALL_POOL,
    World,
    http_json,
    known_answer_body,
    output_ids,
)
from plugin_helpers import BIN, kubectl_kvgate, plugin_directory
from scenario_helpers import (
    SERVED_MODEL,
    on_pool_without_estimate,
    refused_with,
    sample_md,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

MD = "first-model"
CONTEXT = 131_072
# The quick start's request (docs/quickstart.md step 5).
CHAT = {
    "model": SERVED_MODEL,
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 8,
}


def url_in_status(world: World, md: str, namespace: str) -> str:
    """``status.url`` of ``md``, as ``kubectl get kvmd`` shows it."""
    recorded = world.get_md(md, namespace)
    assert recorded is not None
    return str(recorded["status"]["url"])


def post_through_url(world: World, url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST ``body`` to ``url + path`` as a pod in the cluster would: cluster DNS answers
    ``<service>.<namespace>.svc`` with the Service's ClusterIP (this world runs no DNS server,
    so the test looks the Service up by the URL's name), and kube-proxy forwards to a router."""
    parts = urlsplit(url)
    service, namespace, svc = (parts.hostname or "").split(".")
    assert svc == "svc" and parts.port is not None, url
    return http_json(
        world.service_url(service, namespace, parts.port) + path, body, timeout=GENERATE_TIMEOUT
    )


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

    # kvgate validate crds/samples/llama-8b-pvc.yaml, for the first ModelDeployment (here the
    # world's sample on the reference engine, which reads no weights, so it needs no source)
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
    # kubectl get kvmd: the short name (`md` is Cluster API's MachineDeployment); the kvgate
    # category holds both kinds, so kubectl get kvgate lists ModelDeployments and RoleScales.
    listed = str(world.kubectl("get", "kvmd", f"--namespace={ns}").stdout)
    assert MD in listed and "URL" in listed.splitlines()[0].split(), listed
    kinds = world.kubectl("api-resources", "--categories=kvgate", "-o", "name").stdout.split()
    assert sorted(kinds) == ["modeldeployments.kvgate.io", "rolescales.kvgate.io"], kinds
    category = world.kubectl("get", "kvgate", f"--namespace={ns}", "-o", "name").stdout.split()
    assert category == [f"modeldeployment.kvgate.io/{MD}"], category
    refused_with(world, ns, MD, "KvPoolTooSmall")
    # Nothing serves: no Service, no URL.
    assert "url" not in (world.get_md(MD, ns) or {}).get("status", {})

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
    wait_md_ready(world, MD, ns, REVISION_DEADLINE, f"{MD} Ready at contextLength {fix['value']:,}")
    ready = kubectl_kvgate(world, plugin_dir, "explain", MD, "-n", ns)
    assert ready.returncode == 0 and f"{MD} in {ns}: Ready (RevisionServing)" in ready.stdout

    # The answer: status.url (kubectl get kvmd's URL column) names the Service, and a chat
    # request and a /generate request through it are answered by the verified engines.
    url = url_in_status(world, MD, ns)
    service = world.get("service", MD, ns)
    assert service is not None
    assert url == f"http://{MD}.{ns}.svc:{service['spec']['ports'][0]['port']}", url
    assert url in str(world.kubectl("get", "kvmd", MD, f"--namespace={ns}").stdout)
    code, chat = post_through_url(world, url, "/v1/chat/completions", CHAT)
    assert code == 200, (code, chat)
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"], chat
    assert chat["usage"]["completion_tokens"] == CHAT["max_tokens"], chat
    code, generated = post_through_url(world, url, "/generate", known_answer_body(SERVED_MODEL))
    assert code == 200 and output_ids(generated) == KNOWN_PROMPT_IDS[:4], (code, generated)
    print(f"MEASURED {url}: chat answered {chat['choices'][0]['message']['content']!r}")

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
