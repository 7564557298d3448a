"""kvgate explain, history and rollback against an API server: the kmock emulator (the reads, the
rollback annotation, the whole command through a kubeconfig) and local HTTP servers that refuse
(403), answer as no API server does, or are not there at all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from aiohttp import web
from factories.cluster_objects import (
    engine_pod,
    event,
    pod_name,
    refused_md,
    serving_md,
    verdict_condition,
)
from factories.kmock_world import NS, declare_resources, requests
from factories.local_http import serving_app
from kvgate.api import labels
from kvgate.cmd.cli import main
from kvgate.kube.cli_access import AccessError, cluster_access
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.md_reads import MissingModelDeployment, read_md, request_rollback
from kvgate.rollout.rollback import ROLLBACK_ANNOTATION

MD_RESOURCE = ("kvgate.io", "v1alpha1", "modeldeployments")


def kubeconfig(path: Path, server: str, namespace: str | None = NS) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "ctx", "context": context}],
                "current-context": "ctx",
            }
        )
    )
    return path


def put(
    km: kmock.KubernetesEmulator,
    md: dict[str, Any],
    pods: Sequence[dict[str, Any]] = (),
    events: Sequence[dict[str, Any]] = (),
) -> None:
    declare_resources(km)
    md["metadata"]["namespace"] = NS
    km.objects[km.resource(*MD_RESOURCE), NS, md["metadata"]["name"]] = md
    for pod in pods:
        km.objects[km.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
    for index, item in enumerate(events):
        item = {**item, "metadata": {"name": f"llama.{index}", "namespace": NS}}
        km.objects[km.resource("", "v1", "events"), NS, f"llama.{index}"] = item


def _refused_with_pods() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    md = refused_md("placeholder")
    rev = md["status"]["targetRevision"]
    decode = verdict_condition("decode", pod_name("llama", rev, "decode"), 44_584)
    md["status"]["rollout"]["refusal"]["message"] = decode["message"]
    return md, [engine_pod("llama", rev, "decode", decode)]


async def test_the_reads_ask_for_the_md_its_engine_pods_and_its_events(
    kmock: kmock.KubernetesEmulator,
) -> None:
    md, pods = _refused_with_pods()
    put(kmock, md, pods, [event("RolloutRefused", "r")])
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    try:
        objects = await read_md(api, NS, "llama")
        with pytest.raises(MissingModelDeployment):
            await read_md(api, NS, "nobody")
    finally:
        await api.close()
    assert objects.md["metadata"]["name"] == "llama"
    assert [p["metadata"]["name"] for p in objects.pods] == [pods[0]["metadata"]["name"]]
    assert [e["reason"] for e in objects.events] == ["RolloutRefused"]
    pod_list, *_ = requests(kmock, "GET", "/pods")
    assert pod_list.url.query["labelSelector"] == (
        f"{labels.DEPLOYMENT}=llama,{labels.COMPONENT}={labels.COMPONENT_ENGINE}"
    )
    event_list, *_ = requests(kmock, "GET", "/events")
    assert "involvedObject.name=llama" in event_list.url.query["fieldSelector"]


async def test_a_rollback_request_writes_only_the_annotation(
    kmock: kmock.KubernetesEmulator,
) -> None:
    md = serving_md()
    put(kmock, md)
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    try:
        await request_rollback(
            api, NS, "llama", {"metadata": {"annotations": {ROLLBACK_ANNOTATION: "abcdefabcd"}}}
        )
    finally:
        await api.close()
    (patch,) = requests(kmock, "PATCH")
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert patch.data == {"metadata": {"annotations": {ROLLBACK_ANNOTATION: "abcdefabcd"}}}
    stored = kmock.objects[kmock.resource(*MD_RESOURCE), NS, "llama"]
    assert stored["metadata"]["annotations"][ROLLBACK_ANNOTATION] == "abcdefabcd"
    assert stored["spec"] == md["spec"]


async def _cli(argv: list[str]) -> int:
    """kvgate's main in a thread: it runs its own event loop, as the installed script does."""
    return await asyncio.to_thread(main, argv)


async def test_explain_through_a_kubeconfig_prints_the_refusal_with_the_numbers(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md, pods = _refused_with_pods()
    put(kmock, md, pods)
    config = kubeconfig(tmp_path / "config", str(kmock.url).rstrip("/"))
    assert await _cli(["explain", "llama", "--kubeconfig", str(config)]) == 1
    out, err = capsys.readouterr()
    assert "llama in models: not Ready (RolloutRefused)" in out, err
    assert "lower spec.model.contextLength to 44,584" in out
    assert await _cli(["explain", "llama", "--kubeconfig", str(config), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert (document["schemaVersion"], document["command"], document["exit_code"]) == (
        1,
        "explain",
        1,
    )
    assert document["roles"]["decode"]["kv_pool_tokens"] == 44_584
    # The bearer token of the kubeconfig's user was sent.
    assert all(r.headers.get("Authorization") == "Bearer t0ken" for r in requests(kmock, "GET"))


async def test_history_and_rollback_through_a_kubeconfig(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md = serving_md()
    older = {
        **md["status"]["history"][0],
        "revision": "0123456789",
        "servedAt": "2026-11-01T00:00:00Z",
    }
    older["spec"] = {**md["spec"], "model": {**md["spec"]["model"], "contextLength": 65_536}}
    md["status"]["history"].append(older)
    put(kmock, md)
    config = kubeconfig(tmp_path / "config", str(kmock.url).rstrip("/"))
    assert await _cli(["history", "llama", "--kubeconfig", str(config), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [r["outcome"] for r in listing["revisions"]] == ["served", "serving"]
    # A revision kvgate has no record of: exit 2, nothing written.
    assert (
        await _cli(["rollback", "llama", "--kubeconfig", str(config), "--to-revision", "fff"]) == 2
    )
    assert "there is no revision fff" in capsys.readouterr().err
    assert requests(kmock, "PATCH") == []
    assert await _cli(["rollback", "llama", "--kubeconfig", str(config)]) == 0
    assert "revision 0123456789" in capsys.readouterr().out
    (patch,) = requests(kmock, "PATCH")
    assert patch.data["metadata"]["annotations"] == {ROLLBACK_ANNOTATION: "0123456789"}
    assert patch.data["metadata"]["resourceVersion"] == md["metadata"]["resourceVersion"]


def _forged_events(md: dict[str, Any]) -> list[dict[str, Any]]:
    """What a namespace editor (``edit`` may create Events) writes on ``md``: a refusal and a
    rollback of a revision that never existed, in kvgate's wording, with kvgate as reporter."""
    serving = md["status"]["servingRevision"]
    forged = [
        event(
            "RolloutRefused",
            f"revision 1fa11ed0 refused (EngineUnsafe): decode pod llama-1fa11ed0-decode-0 "
            f"reports KV pool 2,048 tokens < context length 131,072 × headroom 1.0; revision "
            f"{serving} keeps serving",
        ),
        event(
            "RollbackStarted",
            "rolling back to revision 1fa11ed0, which served from 2026-11-01T10:00:00Z",
            type_="Normal",
        ),
    ]
    for item in forged:
        item.update(source={"component": "kvgate"}, reportingComponent="kvgate")
    return forged


async def test_events_anyone_can_create_decide_no_row_of_history_and_no_rollback_target(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md = serving_md()
    serving = md["status"]["servingRevision"]
    put(kmock, md, events=_forged_events(md))
    config = kubeconfig(tmp_path / "config", str(kmock.url).rstrip("/"))
    assert await _cli(["history", "llama", "--kubeconfig", str(config), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    rows = [(r["number"], r["revision"], r["outcome"]) for r in listing["revisions"]]
    assert rows == [(1, serving, "serving")]
    assert await _cli(["history", "llama", "--kubeconfig", str(config)]) == 0
    assert "1fa11ed0" not in capsys.readouterr().out
    for asked in ("1fa11ed0", "2"):
        argv = ["rollback", "llama", "--kubeconfig", str(config), "--to-revision", asked]
        assert await _cli(argv) == 2
        err = capsys.readouterr().err
        assert f"there is no revision {asked};" in err and "2,048" not in err, err
    assert requests(kmock, "PATCH") == []
    # Neither command reads Events at all: they are not kvgate's record.
    assert requests(kmock, "GET", "/events") == []


async def test_explain_shows_events_only_as_events_with_the_reporter_they_claim(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md = serving_md()
    put(kmock, md, events=_forged_events(md))
    config = kubeconfig(tmp_path / "config", str(kmock.url).rstrip("/"))
    assert await _cli(["explain", "llama", "--kubeconfig", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "llama in models: Ready (RevisionServing)", lines
    heading = next(i for i, line in enumerate(lines) if line.startswith("Events "))
    assert "not kvgate's record" in lines[heading], lines
    forged = [i for i, line in enumerate(lines) if "1fa11ed0" in line]
    assert len(forged) == 2 and min(forged) > heading, lines
    assert all("reported as kvgate:" in lines[i] for i in forged), lines


async def test_a_missing_model_deployment_is_exit_2_naming_the_namespace(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    put(kmock, serving_md())
    config = kubeconfig(tmp_path / "config", str(kmock.url).rstrip("/"))
    assert await _cli(["explain", "nobody", "--kubeconfig", str(config), "-n", "other"]) == 2
    err = capsys.readouterr().err
    assert "no ModelDeployment nobody in namespace other" in err and "Traceback" not in err


async def test_an_unreachable_api_server_is_exit_2_naming_the_server_and_the_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "config", "http://127.0.0.1:9")
    for command in ("explain", "history", "rollback"):
        assert await _cli([command, "llama", "--kubeconfig", str(config)]) == 2
        err = capsys.readouterr().err
        assert "cannot reach the API server http://127.0.0.1:9" in err, err
        assert str(config) in err and "Traceback" not in err
    assert await _cli(["explain", "llama", "--kubeconfig", str(config), "--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["error"]["input"] == "--kubeconfig"
    assert "http://127.0.0.1:9" in document["error"]["message"]


async def test_a_kubeconfig_nested_past_the_bound_is_exit_2_naming_the_file_unparsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loader's scanner costs the square of the depth (5,000 lists: 1.8 s of CPU); the file
    is refused at its 101st level instead of parsed."""
    config = tmp_path / "config"
    config.write_text("clusters: " + "[" * 5_000 + "]" * 5_000 + "\n")
    assert await _cli(["history", "llama", "--kubeconfig", str(config)]) == 2
    err = capsys.readouterr().err
    assert (
        f"kubeconfig {config} opens more than 100 flow collections ([ or {{) inside each other, "
        "which no kubeconfig does; pass a kubeconfig file"
    ) in err, err


async def test_an_api_server_that_refuses_or_is_not_one_is_exit_2_saying_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def forbidden(request: web.Request) -> web.Response:
        status = {"kind": "Status", "message": 'modeldeployments.kvgate.io "llama" is forbidden'}
        return web.json_response(status, status=403)

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>a proxy</html>", content_type="text/html")

    for handler, said in ((forbidden, "HTTP 403"), (html, "not JSON")):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        async with serving_app(app) as url:
            config = kubeconfig(tmp_path / "config", url)
            assert await _cli(["explain", "llama", "--kubeconfig", str(config)]) == 2
        err = capsys.readouterr().err
        assert said in err and url in err and "Traceback" not in err, err


def test_the_cluster_is_found_as_kubectl_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    first = kubeconfig(tmp_path / "a", "http://127.0.0.1:1001", namespace="from-a")
    # --kubeconfig wins; then KUBECONFIG (the first file that sets the current context wins);
    # then ~/.kube/config; -n over the context's namespace.
    access = cluster_access(kubeconfig=str(first), environ={})
    assert (access.credentials.server, access.namespace) == ("http://127.0.0.1:1001", "from-a")
    assert access.credentials.token == "t0ken"
    second = kubeconfig(tmp_path / "b", "http://127.0.0.1:1002", namespace=None)
    access = cluster_access(environ={"KUBECONFIG": f"{tmp_path / 'missing'}:{second}"})
    assert (access.credentials.server, access.namespace) == ("http://127.0.0.1:1002", "default")
    assert access.source_input == "KUBECONFIG"
    with pytest.raises(AccessError) as none:
        cluster_access(environ={})
    assert "no cluster to talk to" in none.value.message
    (tmp_path / ".kube").mkdir()
    kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:1003")
    access = cluster_access(environ={}, namespace="mine")
    assert (access.credentials.server, access.namespace) == ("http://127.0.0.1:1003", "mine")
    with pytest.raises(AccessError) as unknown:
        cluster_access(kubeconfig=str(first), context="nope", environ={})
    assert unknown.value.input == "--context" and "its contexts: ctx" in unknown.value.message
