"""What the operator watches, and how (at rest, API traffic proportional to changes,
not to fleet size): every object a settled pass would repair is watched, so no timer has to
find it; owned kinds are filtered by kvgate's label on the server; pods are not."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kopf._cogs.structs import references
from kvgate.api import labels
from kvgate.controller import deployments, main, md_loops
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings


def _resource(group: str, plural: str, kind: str) -> references.Resource:
    return references.Resource(
        group=group, version="v1", plural=plural, kind=kind, singular=kind.lower(), namespaced=True
    )


@pytest.fixture
async def configured() -> kopf.OperatorSettings:
    registry = main.register_handlers()
    (configure,) = [
        h for h in registry._activities.get_all_handlers() if h.id.endswith(".configure")
    ]
    settings = kopf.OperatorSettings()
    api = KubeApi(Credentials(server="http://127.0.0.1:9"))
    main._runtime = Runtime(
        api=api,
        settings=OperatorSettings(webhook=False),
        verify=None,  # type: ignore[arg-type]
    )
    try:
        await configure.fn(settings=settings)  # type: ignore[call-arg]
    finally:
        main._runtime = None
        await api.close()
    return settings


MANAGED = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"


@pytest.mark.parametrize(
    ("group", "plural", "kind"),
    [
        ("", "services", "Service"),
        ("", "serviceaccounts", "ServiceAccount"),
        ("rbac.authorization.k8s.io", "roles", "Role"),
        ("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
        ("networking.k8s.io", "networkpolicies", "NetworkPolicy"),
    ],
)
def test_owned_kinds_are_filtered_by_kvgates_label_on_the_server(
    configured: kopf.OperatorSettings, group: str, plural: str, kind: str
) -> None:
    selectors = configured.watching.label_selectors.collect(_resource(group, plural, kind))
    assert selectors == [MANAGED]


def test_kopfs_pods_are_filtered_by_component_only_so_look_alikes_are_still_seen(
    configured: kopf.OperatorSettings,
) -> None:
    """kopf watches routers and multi-node workers (engine pods are the operator's own watch,
    kvgate.kube.informer): not the 9,000 engine pods of 1,000 ModelDeployments a second time, yet
    any pod with one of those components, whoever manages it."""
    selectors = configured.watching.label_selectors.collect(_resource("", "pods", "Pod"))
    assert selectors == ["kvgate.io/component in (router,engine-worker)"]


def test_engine_pods_have_no_kopf_handler_the_operators_own_watch_delivers_them() -> None:
    registry = main.register_handlers()
    pod_handlers = [
        h
        for h in registry._watching.get_all_handlers()
        if h.selector is not None and (h.selector.plural or h.selector.any_name) == "pods"
    ]
    components = {(h.labels or {}).get(labels.COMPONENT) for h in pod_handlers}
    assert components == {labels.COMPONENT_ROUTER, "engine-worker"}
    assert len(components) == len(pod_handlers)


def test_every_kind_a_settled_pass_repairs_is_watched() -> None:
    """By kopf; ModelDeployments, engine pods and kvgate's Deployments are the operator's own
    watches (below)."""
    registry = main.register_handlers()
    watched = {
        (h.selector.group or "", h.selector.plural or h.selector.any_name)
        for h in registry._watching.get_all_handlers()
        if h.selector is not None
    }
    for group, plural in [
        ("", "pods"),
        ("", "services"),
        ("", "serviceaccounts"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("networking.k8s.io", "networkpolicies"),
    ]:
        assert (group, plural) in watched, (group, plural)


async def test_kopf_builds_no_per_event_diff_of_a_watched_object(
    configured: kopf.OperatorSettings,
) -> None:
    """kopf would deep-copy every watched object per event to diff it (7 % of the operator's
    CPU at 1,000 ModelDeployments); kvgate's handlers never read that diff."""
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "engine", "image": "x"}]},
        "status": {"phase": "Running"},
    }
    storage = configured.persistence.diffbase_storage
    assert storage.build(body=kopf.Body(pod)) == {}
    assert storage.fetch(body=kopf.Body(pod)) is None


def test_no_registered_handler_reads_a_diff() -> None:
    """Change handlers, daemons and timers read kopf's diff; with one registered, the empty
    diffbase above would hide every change from it."""
    registry = main.register_handlers()
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()


async def test_the_initial_listing_comes_in_pages(configured: kopf.OperatorSettings) -> None:
    """An unpaged list of 9,000 pods is ~90 MB of JSON at once (a leader restarted at 1,000
    ModelDeployments peaked at 750 MB RSS)."""
    assert configured.watching.chunk_size == main.LIST_CHUNK_SIZE == 500


def test_kvgates_deployments_are_the_operators_own_watch_not_kopfs() -> None:
    """kopf would keep its own state per Deployment and the pass could not know when every
    Deployment is stored; the operator's reflector (deployments.start_reflectors) has them,
    filtered by kvgate's label on the server."""
    registry = main.register_handlers()
    kopf_plurals = {
        h.selector.plural or h.selector.any_name
        for h in registry._watching.get_all_handlers()
        if h.selector is not None
    }
    assert "deployments" not in kopf_plurals
    assert deployments.MANAGED_SELECTOR == MANAGED


def test_modeldeployments_are_the_operators_own_watch_not_kopfs() -> None:
    """A standby keeps them in its store (kvgate.controller.standby) and leads from there: kopf
    runs only in the leader and would list them again from nothing after a failover."""
    registry = main.register_handlers()
    kopf_plurals = {
        h.selector.plural or h.selector.any_name
        for h in registry._watching.get_all_handlers()
        if h.selector is not None
    }
    assert "modeldeployments" not in kopf_plurals
    assert md_loops.MODEL_DEPLOYMENTS.cluster_path == "/apis/kvgate.io/v1alpha1/modeldeployments"


def _role_scale_handler() -> Any:
    registry = main.register_handlers()
    (handler,) = [
        h
        for h in registry._watching.get_all_handlers()
        if h.selector is not None and (h.selector.plural or h.selector.any_name) == "rolescales"
    ]
    return handler


async def test_every_role_scale_is_watched_whatever_its_labels(
    configured: kopf.OperatorSettings,
) -> None:
    """kvgate reads a RoleScale by its name (<md>-<role>): a count asked of one whose labels are
    gone must still wake its ModelDeployment's pass at once, not at the steady resync."""
    assert not _role_scale_handler().labels
    resource = references.Resource(
        group="kvgate.io",
        version="v1alpha1",
        plural="rolescales",
        kind="RoleScale",
        singular="rolescale",
        namespaced=True,
    )
    assert configured.watching.label_selectors.collect(resource) == []


async def test_a_role_scale_event_wakes_the_model_deployment_its_name_names() -> None:
    api = KubeApi(Credentials(server="http://127.0.0.1:9"))
    rt = Runtime(api=api, settings=OperatorSettings(webhook=False), verify=None)  # type: ignore[arg-type]
    rt.mds[("team", "llama-3")] = {"metadata": {"name": "llama-3", "namespace": "team"}}
    handler = _role_scale_handler()
    main._runtime = rt
    try:
        for name in ("stranger-decode", "llama-3-router", "llama-3-decode"):
            # No labels, and a count asked for (generation 2, status at 1).
            unlabelled = {
                "metadata": {"name": name, "namespace": "team", "generation": 2},
                "status": {"observedGeneration": 1},
            }
            await handler.fn(event={"type": "MODIFIED", "object": unlabelled})
            woken = ("team", "llama-3") in rt._md_wakes and rt.md_wake(("team", "llama-3"))
            assert bool(woken and woken.is_set()) == (name == "llama-3-decode"), name
    finally:
        main._runtime = None
        await api.close()
    # Only ModelDeployments kvgate knows are woken: a RoleScale named for none keeps no wake.
    assert set(rt._md_wakes) == {("team", "llama-3")}
