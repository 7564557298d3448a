"""What the cluster commands read and write through the API, and nothing else: a
ModelDeployment, its engine pods and its Events (``kvgate explain``, ``history``), and the
``kvgate.io/rollback`` annotation (``kvgate rollback``). Every failure to reach or use the API
server becomes an :class:`~kvgate.kube.cli_access.AccessError` naming the server and where its
address came from.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

from kvgate.api import labels
from kvgate.api.content_types import MERGE_PATCH
from kvgate.kube.cli_access import AccessError, ClusterAccess
from kvgate.kube.k8s import ApiError, Body, KubeApi

# One deadline per request; kubectl's own default is none, but a command that hangs on an
# unreachable server helps no one.
REQUEST_TIMEOUT_SECONDS = 20.0
T = TypeVar("T")


@dataclass(frozen=True)
class MdObjects:
    """A ModelDeployment as the API server holds it, its engine pods and its Events."""

    md: Body
    pods: list[Body]
    events: list[Body]


class MissingModelDeployment(Exception):
    """No ModelDeployment of that name in that namespace."""


async def read_md(
    api: KubeApi, namespace: str, name: str, *, pods: bool = True, events: bool = True
) -> MdObjects:
    """The ModelDeployment, its engine pods (``pods``) and its Events (``events``), read at
    once."""
    md_read = api.get("ModelDeployment", namespace, name)
    pod_read: Awaitable[list[Body]] = (
        api.list(
            "Pod",
            namespace,
            {labels.DEPLOYMENT: name, labels.COMPONENT: labels.COMPONENT_ENGINE},
        )
        if pods
        else _nothing()
    )
    event_read: Awaitable[Body | None] = (
        api.request(
            "GET",
            api.path("Event", namespace),
            params={
                "fieldSelector": f"involvedObject.kind=ModelDeployment,involvedObject.name={name}"
            },
        )
        if events
        else _none()
    )
    md, pod_items, event_list = await asyncio.gather(md_read, pod_read, event_read)
    if md is None:
        raise MissingModelDeployment(name)
    return MdObjects(md, pod_items, list((event_list or {}).get("items") or []))


async def _nothing() -> list[Body]:
    return []


async def _none() -> Body | None:
    return None


async def request_rollback(api: KubeApi, namespace: str, name: str, patch: Body) -> Body | None:
    """Write the rollback annotation (a merge patch of the ModelDeployment's metadata)."""
    return await api.patch("ModelDeployment", namespace, name, patch, content_type=MERGE_PATCH)


def _api_problem(error: ApiError, access: ClusterAccess) -> str:
    server = access.credentials.server
    if error.status == 401:
        return (
            f"the API server {server} did not accept the credentials of {access.source} (HTTP "
            f"401: {error.message}); renew them (does `kubectl get kvmd` work?)"
        )
    if error.status == 403:
        return (
            f"the API server {server} refused it to the user of {access.source} (HTTP 403: "
            f"{error.message}); kvgate history needs get on modeldeployments, kvgate explain "
            "also list on pods and events in the namespace, kvgate rollback get and patch on "
            "modeldeployments"
        )
    if error.status == 409:
        return "the ModelDeployment changed while kvgate read it (HTTP 409); run the command again"
    return f"the API server {server} answered HTTP {error.status}: {error.message}"


def run_against(
    access: ClusterAccess,
    work: Callable[[KubeApi], Awaitable[T]],
    *,
    timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> T:
    """Run ``work`` with a client for ``access``; AccessError for whatever keeps the API server
    from answering (unreachable, TLS, credentials, RBAC, not an API server)."""
    server = access.credentials.server

    async def session() -> T:
        api = KubeApi(access.credentials, timeout=timeout)
        try:
            return await work(api)
        finally:
            await api.close()

    try:
        return asyncio.run(session())
    except ApiError as error:
        raise AccessError(access.source_input, _api_problem(error, access)) from None
    except TimeoutError:
        raise AccessError(
            access.source_input,
            f"the API server {server} (from {access.source}) did not answer within "
            f"{timeout:g} s; check that the cluster is up and reachable from here",
        ) from None
    except aiohttp.ClientConnectorCertificateError as error:
        raise AccessError(
            access.source_input,
            f"the API server {server} (from {access.source}) has a certificate kvgate cannot "
            f"verify ({error.certificate_error}); check the kubeconfig's certificate-authority",
        ) from None
    except (aiohttp.ClientError, OSError) as error:
        detail = str(error) or type(error).__name__
        raise AccessError(
            access.source_input,
            f"cannot reach the API server {server} (from {access.source}): {detail[:300]}; check "
            "that the cluster is up and the kubeconfig's server address",
        ) from None
    except json.JSONDecodeError:
        raise AccessError(
            access.source_input,
            f"{server} (from {access.source}) did not answer as a Kubernetes API server (not "
            "JSON); check the kubeconfig's server address",
        ) from None


def describe_missing(access: ClusterAccess, namespace: str, name: str) -> str:
    return (
        f"there is no ModelDeployment {name} in namespace {namespace} (API server "
        f"{access.credentials.server}, from {access.source}); `kubectl get kvmd -n {namespace}` "
        "lists them, -n picks another namespace (none at all: is kvgate's CRD installed?)"
    )


__all__ = [
    "MdObjects",
    "MissingModelDeployment",
    "describe_missing",
    "read_md",
    "request_rollback",
    "run_against",
]
