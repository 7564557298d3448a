"""Reads (GET and LIST) from the e2e apiserver in the test process, as ``kubectl get -o json``.

``World.get`` and ``World.list`` run in every wait loop of the e2e tier; each used to start the
built kubectl (``ip netns exec`` + a 150 MB Go binary): about 100 ms of CPU per call on a 2-core
machine that also runs the control plane and every pod. ``ApiReader`` keeps one HTTPS connection
per thread to the apiserver (through the cluster's host relay, as the admin) and answers the same
JSON in about 2 ms.

Kinds are resolved the way kubectl resolves them, from the apiserver's discovery: a resource's
plural, singular, short names or kind, optionally qualified by its group (``deployments.apps``,
``md``); an unqualified name prefers the core group, then the groups in discovery order (so
``events`` is ``v1`` Events). Discovery is cached and re-read once for a name it does not know
(a CRD installed since). Objects read as kubectl prints them: a list's items carry ``apiVersion``
and ``kind``, and ``metadata.managedFields`` is left out (``--show-managed-fields=false``). A
namespaced kind without a namespace reads ``default`` (the kubeconfig's namespace).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate_e2e.cluster import ClusterError
from kvgate_e2e.cluster_like import ClusterLike


class ReadError(ClusterError):
    """The apiserver could not be read, or answered an error other than NotFound."""


@dataclass(frozen=True)
class Resource:
    """One API resource: ``/apis/apps/v1`` + ``deployments``."""

    prefix: str  # "/api/v1" or "/apis/<group>/<version>"
    plural: str
    namespaced: bool
    api_version: str  # "v1", "apps/v1"
    kind: str

    def path(self, namespace: str | None, name: str | None = None) -> str:
        parts = [self.prefix]
        if self.namespaced:
            parts += ["namespaces", urllib.parse.quote(namespace or "default", safe="")]
        parts.append(self.plural)
        if name is not None:
            parts.append(urllib.parse.quote(name, safe=""))
        return "/".join(parts)


def resource_names(
    group_versions: Iterable[tuple[str, str, Iterable[Mapping[str, Any]]]],
) -> dict[str, Resource]:
    """Every name kubectl accepts for a resource -> the resource (pure).

    ``group_versions`` is ``(group, version, discovery resources)`` in priority order (the core
    group first, then the groups in discovery order); the first resource to claim a name keeps it.
    """
    names: dict[str, Resource] = {}
    for group, version, resources in group_versions:
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        for res in resources:
            plural = str(res.get("name", ""))
            if not plural or "/" in plural:  # subresources: pods/status, ...
                continue
            kind = str(res.get("kind", ""))
            resource = Resource(
                prefix=prefix,
                plural=plural,
                namespaced=bool(res.get("namespaced")),
                api_version=f"{group}/{version}" if group else version,
                kind=kind,
            )
            short = [str(s) for s in res.get("shortNames") or []]
            singular = str(res.get("singularName") or "") or kind.lower()
            for alias in dict.fromkeys([plural, singular, kind.lower(), *short]):
                names.setdefault(alias, resource)
                if group:
                    names.setdefault(f"{alias}.{group}", resource)
    return names


def as_printed(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object as ``kubectl get -o json`` prints it: without ``managedFields`` (pure)."""
    out = dict(obj)
    if isinstance(out.get("metadata"), Mapping) and "managedFields" in out["metadata"]:
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "managedFields"}
    return out


def as_listed(items: Iterable[Mapping[str, Any]], resource: Resource) -> list[dict[str, Any]]:
    """List items as ``kubectl get -o json`` prints them: each with apiVersion and kind (pure)."""
    return [
        as_printed({"apiVersion": resource.api_version, "kind": resource.kind, **item})
        for item in items
    ]


class ApiReader:
    """GET and LIST as the admin, one keep-alive connection per thread (thread-safe)."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext,
        timeout: float = 60.0,
    ) -> None:
        self._host, self._port, self._tls, self._timeout = host, port, tls, timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._names: dict[str, Resource] | None = None

    @classmethod
    def for_cluster(cls, cluster: ClusterLike) -> ApiReader:
        """A reader of ``cluster`` as its admin, through the host relay."""
        tls = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        tls.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
        url = urllib.parse.urlsplit(cluster.host_apiserver_url)
        return cls(url.hostname or "127.0.0.1", url.port or 443, tls)

    # ------------------------------------------------------------------ reads
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        resource = self.resource(kind)
        status, body = self._request(resource.path(namespace, name))
        if status == 404:
            return None
        return as_printed(self._json(status, body, f"get {kind} {name}"))

    def list(self, kind: str, namespace: str | None, selector: str = "") -> list[dict[str, Any]]:
        """The items of ``kind`` (in ``namespace``, for a namespaced kind) matching ``selector``."""
        resource = self.resource(kind)
        path = resource.path(namespace)
        if selector:
            path += "?" + urllib.parse.urlencode({"labelSelector": selector})
        status, body = self._request(path)
        answer = self._json(status, body, f"list {kind}")
        return as_listed(answer.get("items") or [], resource)

    def resource(self, kind: str) -> Resource:
        """The resource ``kind`` names (discovery re-read once for a name not seen yet)."""
        key = kind.lower()
        with self._lock:
            names = self._names
        if names is None or key not in names:
            names = self._discover()
            with self._lock:
                self._names = names
        if key not in names:
            raise ReadError(f'the server doesn\'t have a resource type "{kind}"')
        return names[key]

    # ------------------------------------------------------------------ plumbing
    def _discover(self) -> dict[str, Resource]:
        core = self._json(*self._request("/api"), "discovery /api")
        order: list[tuple[str, str, Iterable[Mapping[str, Any]]]] = []
        for version in core.get("versions") or []:
            listing = self._json(*self._request(f"/api/{version}"), f"discovery /api/{version}")
            order.append(("", version, listing.get("resources") or []))
        groups = self._json(*self._request("/apis"), "discovery /apis")
        for group in groups.get("groups") or []:
            gv = (group.get("preferredVersion") or {}).get("groupVersion")
            if not gv:
                continue
            status, body = self._request(f"/apis/{gv}")
            if status != 200:  # an aggregated API that is down: kubectl skips it too
                continue
            listing = self._json(status, body, f"discovery /apis/{gv}")
            name, _, version = str(gv).partition("/")
            order.append((name, version, listing.get("resources") or []))
        return resource_names(order)

    @staticmethod
    def _json(status: int, body: bytes, what: str) -> dict[str, Any]:
        if status != 200:
            raise ReadError(f"{what}: HTTP {status}: {body[:500].decode(errors='replace')}")
        return dict(json.loads(body))

    def _request(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` on this thread's connection; a connection the server closed while idle
        is replaced once (a GET is safe to repeat)."""
        for attempt in (1, 2):
            conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, context=self._tls, timeout=self._timeout
                )
                self._local.conn = conn
            try:
                conn.request("GET", path, headers={"Accept": "application/json"})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise ReadError(f"GET {path}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close this thread's connection (others close with their threads)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
