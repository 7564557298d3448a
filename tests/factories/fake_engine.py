"""A tiny SGLang-shaped engine on 127.0.0.1: /health, /server_info, /v1/models; pool is mutable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web


@dataclass
class FakeEngine:
    role: str
    context_length: int
    kv_pool_tokens: int
    version: str = "0.5.23"
    port: int = 0
    # Started with --api-key: /server_info and /v1/models want `Authorization: Bearer <key>`,
    # /health stays open (sglang/srt/utils/auth.py decide_request_auth).
    api_key: str | None = None

    def authorized(self, request: web.Request) -> bool:
        return self.api_key is None or request.headers.get("Authorization") == (
            f"Bearer {self.api_key}"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server_info(self) -> dict[str, object]:
        return {
            "version": self.version,
            "disaggregation_mode": self.role,
            "served_model_name": "llama-3.1-8b",
            "context_length": self.context_length,
            "max_total_num_tokens": self.kv_pool_tokens,
            "max_req_input_len": min(self.context_length - 1, self.kv_pool_tokens - 1) - 5,
            "internal_states": [{"memory_usage": {"token_capacity": self.kv_pool_tokens}}],
        }

    def models(self) -> dict[str, object]:
        return {
            "object": "list",
            "data": [
                {
                    "id": "llama-3.1-8b",
                    "object": "model",
                    "owned_by": "sglang",
                    "max_model_len": self.context_length,
                }
            ],
        }


@asynccontextmanager
async def running(engine: FakeEngine) -> AsyncIterator[FakeEngine]:
    async def server_info(request: web.Request) -> web.Response:
        if not engine.authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response(engine.server_info())

    async def models(request: web.Request) -> web.Response:
        if not engine.authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response(engine.models())

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", engine.port)  # 0: any free port
    await site.start()
    engine.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield engine
    finally:
        await runner.cleanup()
