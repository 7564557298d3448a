"""A thin asyncio client for the few apiserver calls the loopback kubelet makes (aiohttp).

Reads a kubeconfig (certificate-authority[-data], client-certificate[-data]/client-key[-data] or
token), and offers get/create/patch/delete plus list-then-watch with resourceVersion resumption.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer from the apiserver."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {path}: HTTP {status}: {body[:400]}")


class KubeConfig:
    """Server URL, CA bundle and client credentials from a kubeconfig file."""

    def __init__(self, path: Path) -> None:
        raw = yaml.safe_load(path.read_text())
        ctx_name = raw.get("current-context")
        contexts = {c["name"]: c["context"] for c in raw.get("contexts") or []}
        ctx = contexts.get(ctx_name) or next(iter(contexts.values()))
        cluster = {c["name"]: c["cluster"] for c in raw["clusters"]}[ctx["cluster"]]
        user = {u["name"]: u["user"] for u in raw.get("users") or []}.get(ctx.get("user"), {})
        self.server: str = str(cluster["server"]).rstrip("/")
        self.ca_pem: bytes = self._material(cluster, "certificate-authority", path.parent)
        self.cert_pem: bytes | None = None
        self.key_pem: bytes | None = None
        if "client-certificate" in user or "client-certificate-data" in user:
            self.cert_pem = self._material(user, "client-certificate", path.parent)
            self.key_pem = self._material(user, "client-key", path.parent)
        self.token: str | None = user.get("token")

    @staticmethod
    def _material(section: Mapping[str, Any], key: str, base: Path) -> bytes:
        if f"{key}-data" in section:
            return base64.b64decode(section[f"{key}-data"])
        file = Path(section[key])
        return (file if file.is_absolute() else base / file).read_bytes()

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode())
        if self.cert_pem is not None and self.key_pem is not None:
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
                cert.write_bytes(self.cert_pem)
                key.write_bytes(self.key_pem)
                key.chmod(0o600)
                ctx.load_cert_chain(str(cert), str(key))
        return ctx


class KubeApi:
    """Async apiserver client; ``async with KubeApi(cfg) as api: ...``."""

    def __init__(self, config: KubeConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeApi:
        headers = {"Accept": "application/json", "User-Agent": "kvgate-loopback-kubelet/0.1"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        self._session = aiohttp.ClientSession(
            base_url=self.config.server,
            headers=headers,
            connector=aiohttp.TCPConnector(ssl=self.config.ssl_context(), limit=32),
            read_bufsize=4 * 1024 * 1024,  # one watch line is one whole object
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeApi used outside `async with`")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method,
            path,
            data=data,
            params=params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise ApiError(method, path, resp.status, text)
            return json.loads(text) if text else None

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body=body)

    async def patch(self, path: str, body: Any, content_type: str = STRATEGIC) -> Any:
        return await self.request("PATCH", path, body=body, content_type=content_type)

    async def delete(self, path: str, body: Any = None) -> Any:
        return await self.request("DELETE", path, body=body)

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[dict[str, Any]]:
        """Events from one watch request (ends when the server closes it; raises ApiError on
        410 Gone so the caller can relist)."""
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "240",
        }
        async with self.session.get(
            path, params=query, timeout=aiohttp.ClientTimeout(total=None, sock_read=300)
        ) as resp:
            if resp.status >= 300:
                raise ApiError("WATCH", path, resp.status, await resp.text())
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError("WATCH", path, int(status.get("code") or 500), str(status))
                yield event
