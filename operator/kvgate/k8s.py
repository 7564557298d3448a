"""A thin async Kubernetes REST client (aiohttp): the few calls the operator makes, with the
exact content types written down (strategic-merge for pod status, merge for the CR status).

Credentials come from the in-cluster service account or the kubeconfig (via the `kubernetes`
package's loader). Plain dicts in, plain dicts out.
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from kvgate import labels
from kvgate.api import GROUP, PLURAL, VERSION

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

Body = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str | None = None
    token_file: str | None = None  # re-read on use: bound service-account tokens rotate
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    def bearer(self) -> str | None:
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        if not self.verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def load_credentials() -> Credentials:
    """In-cluster service account if present, else the current kubeconfig context."""
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    if host and port and (SA_DIR / "token").exists():
        server_host = f"[{host}]" if ":" in host else host
        return Credentials(
            server=f"https://{server_host}:{port}",
            token_file=str(SA_DIR / "token"),
            ca_file=str(SA_DIR / "ca.crt"),
        )
    from kubernetes import config  # the kubeconfig loader only; no API calls through it
    from kubernetes.client import Configuration

    cfg = Configuration()
    config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    raw = cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization")
    token = raw.removeprefix("Bearer ").strip() if raw else None
    return Credentials(
        server=str(cfg.host).rstrip("/"),
        token=token,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
    )


def _selector(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector.items())


class KubeApi:
    """The operator's API calls. One aiohttp session, reused."""

    def __init__(self, credentials: Credentials, *, timeout: float = 30.0) -> None:
        self.credentials = credentials
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context(), limit=32)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Body | None = None,
        content_type: str = JSON,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Body | None:
        headers = {"Accept": JSON}
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with self._session_now().request(
            method, self.credentials.server + path, data=data, headers=headers, params=params
        ) as response:
            text = await response.text()
            if response.status == 404 and missing_ok:
                return None
            if response.status >= 400:
                try:
                    message = str(json.loads(text).get("message", text))
                except (ValueError, AttributeError):
                    message = text[:500]
                raise ApiError(response.status, method, path, message)
            if not text:
                return {}
            result: Body = json.loads(text)
            return result

    # -- paths ------------------------------------------------------------------------------
    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        bases = {
            "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments",
            "ReplicaSet": f"/apis/apps/v1/namespaces/{namespace}/replicasets",
            "Secret": f"/api/v1/namespaces/{namespace}/secrets",
            "NetworkPolicy": f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
            "Pod": f"/api/v1/namespaces/{namespace}/pods",
            "Service": f"/api/v1/namespaces/{namespace}/services",
            "ServiceAccount": f"/api/v1/namespaces/{namespace}/serviceaccounts",
            "Event": f"/api/v1/namespaces/{namespace}/events",
            "Role": f"{RBAC}/namespaces/{namespace}/roles",
            "RoleBinding": f"{RBAC}/namespaces/{namespace}/rolebindings",
            "ModelDeployment": f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
        }
        out = bases[kind]
        if name is not None:
            out += "/" + quote(name, safe="")
        if sub is not None:
            out += "/" + sub
        return out

    # -- generic verbs ----------------------------------------------------------------------
    async def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Body]:
        doc = await self.request(
            "GET", self.path(kind, namespace), params={"labelSelector": _selector(selector)}
        )
        items: list[Body] = (doc or {}).get("items", [])
        return items

    async def get(self, kind: str, namespace: str, name: str) -> Body | None:
        return await self.request("GET", self.path(kind, namespace, name), missing_ok=True)

    async def create(self, body: Body) -> Body | None:
        """Create; an object that already exists (HTTP 409) is fine (idempotent)."""
        meta = body["metadata"]
        try:
            return await self.request("POST", self.path(body["kind"], meta["namespace"]), body=body)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Body, *, content_type: str = MERGE_PATCH
    ) -> Body | None:
        return await self.request(
            "PATCH", self.path(kind, namespace, name), body=patch, content_type=content_type
        )

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        await self.request(
            "DELETE",
            self.path(kind, namespace, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            missing_ok=True,
        )

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete one pod, only if it is still the pod with this uid (a precondition: a pod
        recreated under the same name gets 409 and is left alone). True when deleted."""
        try:
            result = await self.request(
                "DELETE",
                self.path("Pod", namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "preconditions": {"uid": uid},
                },
                missing_ok=True,
            )
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return result is not None

    # -- the two status writes kvgate makes -------------------------------------------------
    async def patch_pod_condition(
        self, namespace: str, name: str, uid: str, condition: dict[str, str]
    ) -> Body | None:
        """Strategic-merge patch of pods/status: conditions merge by `type` (the kubelet's own
        conditions are untouched); metadata.uid is a precondition (a recreated pod of the same
        name gets 409, never another pod's verdict)."""
        patch = {"metadata": {"uid": uid}, "status": {"conditions": [condition]}}
        return await self.request(
            "PATCH",
            self.path("Pod", namespace, name, "status"),
            body=patch,
            content_type=STRATEGIC_MERGE_PATCH,
            missing_ok=True,
        )

    async def patch_md_status(self, namespace: str, name: str, status: Body) -> Body | None:
        """Merge patch of the CR's status subresource (kvgate owns the whole status)."""
        return await self.request(
            "PATCH",
            self.path("ModelDeployment", namespace, name, "status"),
            body={"status": status},
            content_type=MERGE_PATCH,
            missing_ok=True,
        )

    async def post_event(
        self, involved: Body, *, type_: str, reason: str, message: str, now: datetime
    ) -> None:
        """A core/v1 Event from component kvgate on the involved object (``now`` in UTC)."""
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'kvgate')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": labels.MANAGED_BY_VALUE},
            # Legacy (firstTimestamp) form: no eventTime, so no reportingController/action rules.
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self.request("POST", self.path("Event", namespace), body=event)
