"""The router's ServiceAccount, Role and RoleBinding are watched: deleting or editing one wakes its
ModelDeployment's loop at once, which puts it back (they were once ensured once per operator
lifetime, then at the steady resync only). The operator's RBAC grants every watch kopf opens."""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_deployments import make_md
from kvgate.controller import main
from kvgate.controller.runtime import Runtime
from kvgate.gen import rbac
from kvgate.objects import builders

MD = make_md()
ROUTER_ACCESS = {
    "serviceaccounts": builders.router_service_account(MD),
    "roles": builders.router_role(MD),
    "rolebindings": builders.router_role_binding(MD),
}


@pytest.fixture(autouse=True)
def _handlers_use_rt(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's watch handlers reach the operator's Runtime through kvgate.controller.main."""
    monkeypatch.setattr(main, "_runtime", rt)


def _watch_handlers() -> list[Any]:
    return list(main.register_handlers()._watching.get_all_handlers())


@pytest.mark.parametrize("event_type", ["DELETED", "MODIFIED"])
@pytest.mark.parametrize("plural", sorted(ROUTER_ACCESS))
async def test_a_deleted_or_edited_router_access_object_wakes_its_modeldeployment(
    rt: Runtime, plural: str, event_type: str
) -> None:
    (handler,) = [h for h in _watch_handlers() if h.selector.any_name == plural]
    body = ROUTER_ACCESS[plural]
    # Only kvgate's own are watched (the label every router access object carries).
    assert handler.labels == {"app.kubernetes.io/managed-by": "kvgate"}
    assert body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvgate"
    key = (MD.metadata.namespace or "", MD.metadata.name or "")
    assert not rt.md_wake(key).is_set()
    await handler.fn(event={"type": event_type, "object": body})
    assert rt.md_wake(key).is_set()
    # ... and its pass reads them again (kvgate.rollout.access_checks).
    assert rt.take_access_changed(key) and not rt.take_access_changed(key)


@pytest.mark.parametrize("plural", sorted(ROUTER_ACCESS))
async def test_the_echo_of_kvgates_own_creation_does_not_make_the_next_pass_read_it_again(
    rt: Runtime, plural: str
) -> None:
    (handler,) = [h for h in _watch_handlers() if h.selector.any_name == plural]
    key = (MD.metadata.namespace or "", MD.metadata.name or "")
    await handler.fn(event={"type": "ADDED", "object": ROUTER_ACCESS[plural]})
    assert rt.md_wake(key).is_set()
    assert not rt.take_access_changed(key)


def test_the_operator_may_list_and_watch_everything_kopf_watches() -> None:
    granted = {
        (rule.group, resource): set(rule.verbs)
        for rule in rbac.RULES
        for resource in rule.resources
    }
    missing = [
        f"{h.selector.group or 'core'}/{h.selector.any_name}"
        for h in _watch_handlers()
        if not {"list", "watch"} <= granted.get((h.selector.group, h.selector.any_name), set())
    ]
    assert missing == [], (
        f"kopf watches these without list/watch in kvgate.gen.rbac.RULES: {missing}"
    )
