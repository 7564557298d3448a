"""The SGLang HTTP surface of the reference engine (aiohttp), with SGLang's JSON keys.

Routes: /health, /health_generate, /ready, /server_info, /get_server_info, /v1/models,
/v1/models/{model}, /model_info, /get_model_info, /generate, /v1/completions,
/v1/chat/completions, and /metrics with --enable-metrics.

Without --skip-tokenizer-init the engine tokenizes text one token per UTF-8 byte, so text in,
text out works (the model echoes its prompt). A streamed /generate sends a token an SSE event.
There is deliberately no /version: smg would take an engine that has one for vLLM. A hostile mode
(``hostile.py``, tests only) replaces the three routes kvgate's probe reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvgate_engine.reference import faults, request_log
from kvgate_engine.reference.args import LaunchArgs
from kvgate_engine.reference.engine import (
    DEFAULT_MAX_NEW_TOKENS,
    GenerateError,
    GenerateRequest,
    GenerateResult,
    ReferenceEngine,
    new_rid,
)
from kvgate_engine.reference.hostile import Handler, Hostile
from kvgate_engine.reference.metrics import build_registry, render
from kvgate_engine.reference.sizing import ModelConfig

log = logging.getLogger("kvgate_engine.reference")
MAX_ROOM = 2**63 - 1


@dataclass
class ServerState:
    engine: ReferenceEngine
    launch: LaunchArgs
    model: ModelConfig
    started_at: float
    phase: str = "starting"  # starting | ready | exiting
    startup_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def served_model_name(self) -> str:
        name = self.launch["served_model_name"]
        return str(name) if name else str(self.launch["model_path"])


STATE: web.AppKey[ServerState] = web.AppKey("state", ServerState)


def resolved_args(state: ServerState) -> dict[str, Any]:
    """Every flag with its resolved value, flat, as ServerArgs.resolved_dict() gives them."""
    limits = state.engine.limits
    values = dict(state.launch.values)
    values.update(
        served_model_name=state.served_model_name,
        tokenizer_path=values["tokenizer_path"] or values["model_path"],
        mem_fraction_static=limits.mem_fraction_static,
        max_running_requests=values["max_running_requests"] or limits.max_running_requests,
        chunked_prefill_size=values["chunked_prefill_size"] or 8192,
        random_seed=values["random_seed"] if values["random_seed"] is not None else 0,
    )
    return values


def server_info(state: ServerState) -> dict[str, Any]:
    engine = state.engine
    limits = engine.limits
    args = resolved_args(state)
    memory_usage: dict[str, Any] = {
        "weight": round(limits.weights_gib, 2),
        "kvcache": limits.kv_cache_gib,
        "startup_available": round(
            max(limits.gpu_memory_gib - limits.weights_gib - limits.kv_cache_gib, 0.0), 2
        ),
        "token_capacity": limits.kv_pool_tokens,
        "token_capacity_swa": None,
        "graph": {},
    }
    internal_state = {
        **args,
        "world_size": args["tp_size"] * args["pp_size"],
        "startup_time": state.startup_seconds,
        "effective_max_running_requests_per_dp": args["max_running_requests"],
        "last_gen_throughput": engine.counters.last_gen_throughput,
        "memory_usage": memory_usage,
        "disaggregation_mode": args["disaggregation_mode"],
    }
    return {
        **args,
        "launch_command": shlex.join(["python3", "-m", "sglang.launch_server", *state.launch.argv]),
        "status": "ready",
        "max_total_num_tokens": limits.kv_pool_tokens,
        "max_req_input_len": limits.max_req_input_len,
        "startup_time": state.startup_seconds,
        "hicache_object_layout": None,
        "kv_events": None,
        "internal_states": [internal_state],
        "version": engine.settings.version,
        "frontend": "python",
    }


def model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "sglang",
        "root": state.launch["model_path"],
        "parent": None,
        "max_model_len": state.engine.limits.context_length,
    }


def model_info(state: ServerState) -> dict[str, Any]:
    config = state.model.config
    return {
        "model_path": state.launch["model_path"],
        "tokenizer_path": state.launch["tokenizer_path"] or state.launch["model_path"],
        "served_model_name": state.served_model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
        "load_format": state.launch["load_format"],
        "disaggregation_mode": state.launch["disaggregation_mode"],
    }


def error_response(message: str, status: int) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


class BadRequest(Exception):
    pass


def _scalar(body: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = body.get(key, default)
    if isinstance(value, list):
        raise BadRequest(
            f"{key} is a list: batch requests are not supported by the kvgate reference engine; "
            f"send one request per prompt"
        )
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise BadRequest(f"{key} must be an integer, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise BadRequest(f"{key} must be a string, got {value!r}")
    return value


def parse_generate(body: object, state: ServerState) -> GenerateRequest:
    """A /generate body → GenerateRequest; raises BadRequest with the field and the way out."""
    if not isinstance(body, dict):
        raise BadRequest("the /generate body must be a JSON object")
    vocab = state.engine.settings.vocab_size
    input_ids = body.get("input_ids")
    text = body.get("text")
    if input_ids is None and text is None:
        raise BadRequest("send input_ids (a list of token ids) or text")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise BadRequest("input_ids must be a non-empty list of token ids")
        if any(isinstance(item, list) for item in input_ids):
            raise BadRequest(
                "input_ids is a list of lists: batch requests are not supported by the kvgate "
                "reference engine; send one request per prompt"
            )
        for index, token in enumerate(input_ids):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise BadRequest(
                    f"input_ids[{index}] = {token!r} is not a token id of this model "
                    f"(0..{vocab - 1:,})"
                )
        ids = tuple(input_ids)
    else:
        if isinstance(text, list):
            raise BadRequest("text is a list: batch requests are not supported; send one prompt")
        if not isinstance(text, str) or not text:
            raise BadRequest("text must be a non-empty string")
        if state.launch["skip_tokenizer_init"]:
            raise BadRequest(
                "text input needs a tokenizer and this engine runs with --skip-tokenizer-init; "
                "send input_ids"
            )
        ids = tuple(text.encode())  # the reference tokenizer: one token per UTF-8 byte
    sampling = body.get("sampling_params") or {}
    if isinstance(sampling, list):
        raise BadRequest("sampling_params is a list: batch requests are not supported")
    if not isinstance(sampling, dict):
        raise BadRequest("sampling_params must be an object")
    max_new = _scalar(sampling, "max_new_tokens", int, DEFAULT_MAX_NEW_TOKENS)
    if max_new < 0:
        raise BadRequest(f"sampling_params.max_new_tokens {max_new} must be >= 0")
    room = _scalar(body, "bootstrap_room", int)
    if room is not None and not 0 <= room <= MAX_ROOM:
        raise BadRequest(f"bootstrap_room {room} must be between 0 and 2^63-1")
    port = _scalar(body, "bootstrap_port", int)
    rid = _scalar(body, "rid", str) or new_rid()
    if state.launch.values.get("log_requests"):
        # SGLang logs the request with the rid it settled on (uuid when none was sent).
        request_log.log_received({**body, "rid": rid}, state.launch["log_requests_level"])
    return GenerateRequest(
        rid=rid,
        input_ids=ids,
        max_new_tokens=max_new,
        bootstrap_host=_scalar(body, "bootstrap_host", str),
        bootstrap_port=port,
        bootstrap_room=room,
    )


Render = Callable[[GenerateResult, dict[str, Any], ServerState], dict[str, Any]]


async def _serve(
    request: web.Request,
    parse: Callable[[object, ServerState], GenerateRequest],
    render: Render,
) -> web.StreamResponse:
    """Parse a body, generate, answer like SGLang's HTTP server.

    A malformed body is refused before anything else (FastAPI validates it first). A streaming
    request then gets its 200 head at once, as SGLang's StreamingResponse does, and any later
    rejection (tokenizer, scheduler, transfer) travels in-band as ``data: {"error": ...}``. That
    is why a gateway that waits only for both legs' heads relays a stream whose prefill leg was
    rejected: the incident's path, reproduced faithfully. The answer's last bytes are written
    inside the engine's accounting (``GenerateRequest.deliver``): the request counts in
    num_running_reqs until they are out.
    """
    state = request.app[STATE]
    if state.phase != "ready":
        return error_response(f"engine is {state.phase}", 503)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error_response(f"the {request.path} body is not valid JSON", 400)
    try:
        generate = parse(body, state)
    except BadRequest as error:
        return error_response(str(error), 400)
    assert isinstance(body, dict)  # parse() accepts only objects
    if not body.get("stream"):
        return await _answer_once(request, generate, body, render)
    return await _answer_stream(request, dataclasses.replace(generate, stream=True), body, render)


async def _answer_once(
    request: web.Request, generate: GenerateRequest, body: dict[str, Any], render: Render
) -> web.StreamResponse:
    state = request.app[STATE]
    answers: list[web.StreamResponse] = []

    async def deliver(outcome: GenerateResult | GenerateError) -> None:
        if isinstance(outcome, GenerateError):
            response = error_response(outcome.message, outcome.status)
        else:
            response = web.json_response(render(outcome, body, state))
        answers.append(response)
        await response.prepare(request)
        await response.write_eof()

    with contextlib.suppress(GenerateError):
        await state.engine.generate(dataclasses.replace(generate, deliver=deliver))
    return answers[0]


async def _answer_stream(
    request: web.Request, generate: GenerateRequest, body: dict[str, Any], render: Render
) -> web.StreamResponse:
    state = request.app[STATE]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    sent: list[int] = []
    if render is render_generate:
        # /generate streams a token an event (incremental output_ids, as SGLang's
        # incremental streaming does); the last event carries the rest and the finish reason.
        async def progress(token: int) -> None:
            sent.append(token)
            event = {
                "output_ids": [token],
                "meta_info": {
                    "id": generate.rid,
                    "finish_reason": None,
                    "prompt_tokens": len(generate.input_ids),
                    "completion_tokens": len(sent),
                },
            }
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")

        generate = dataclasses.replace(generate, progress=progress)

    async def deliver(outcome: GenerateResult | GenerateError) -> None:
        event: dict[str, Any]
        if isinstance(outcome, GenerateError):
            event = {"error": {"message": outcome.message, "code": outcome.status}}
        else:
            event = render(outcome, body, state)
            if sent:
                event["output_ids"] = event["output_ids"][len(sent) :]
                if "text" in event:
                    event["text"] = detokenize(event["output_ids"])
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    with contextlib.suppress(GenerateError):
        await state.engine.generate(dataclasses.replace(generate, deliver=deliver))
    return response


def detokenize(output_ids: list[int]) -> str:
    """The reference tokenizer's inverse: token ids below 256 are UTF-8 bytes."""
    return bytes(t for t in output_ids if t < 256).decode(errors="replace")


def render_generate(
    result: GenerateResult, body: dict[str, Any], state: ServerState
) -> dict[str, Any]:
    payload: dict[str, Any] = {"output_ids": result.output_ids, "meta_info": result.meta_info()}
    if not state.launch["skip_tokenizer_init"]:
        payload["text"] = detokenize(result.output_ids)
    return payload


async def handle_generate(request: web.Request) -> web.StreamResponse:
    return await _serve(request, parse_generate, render_generate)


def _openai_prompt(body: dict[str, Any], chat: bool) -> str | list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list of {role, content}")
        contents = [m.get("content") if isinstance(m, dict) else None for m in messages]
        if not all(isinstance(c, str) for c in contents):
            raise BadRequest("every message needs a string content")
        return "\n".join(str(c) for c in contents)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        raise BadRequest("prompt is a list of prompts: batch requests are not supported")
    if not isinstance(prompt, str | list) or not prompt:
        raise BadRequest("prompt must be a non-empty string or list of token ids")
    return prompt


def parse_openai(body: object, state: ServerState, *, chat: bool) -> GenerateRequest:
    """An OpenAI completions/chat body (with the PD bootstrap fields) → GenerateRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if state.launch["skip_tokenizer_init"]:
        raise BadRequest(
            "OpenAI endpoints need a tokenizer and this engine runs with "
            "--skip-tokenizer-init; use /generate with input_ids"
        )
    prompt = _openai_prompt(body, chat)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    native = {
        ("text" if isinstance(prompt, str) else "input_ids"): prompt,
        "sampling_params": {"max_new_tokens": max_tokens if max_tokens is not None else 16},
        **{
            k: body[k]
            for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room", "rid")
            if k in body
        },
    }
    return parse_generate(native, state)


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=False)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=True)


async def _openai(request: web.Request, *, chat: bool) -> web.StreamResponse:
    return await _serve(
        request,
        lambda body, state: parse_openai(body, state, chat=chat),
        lambda result, body, state: render_openai(result, state, chat=chat),
    )


def render_openai(result: GenerateResult, state: ServerState, *, chat: bool) -> dict[str, Any]:
    text = detokenize(result.output_ids)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    payload = {
        "id": result.rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": state.served_model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": len(result.output_ids),
            "total_tokens": result.prompt_tokens + len(result.output_ids),
        },
    }
    return payload


async def handle_health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.phase != "ready" or not state.engine.health_forward():
        return web.Response(status=503)
    return web.Response(status=200)


async def handle_ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[STATE].phase == "ready" else 503)


async def handle_server_info(request: web.Request) -> web.Response:
    return web.json_response(server_info(request.app[STATE]))


async def handle_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [model_card(request.app[STATE])]})


async def handle_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if request.match_info["model"] != state.served_model_name:
        return error_response(f"model {request.match_info['model']!r} not found", 404)
    return web.json_response(model_card(state))


async def handle_model_info(request: web.Request) -> web.Response:
    return web.json_response(model_info(request.app[STATE]))


def bearer_allowed(path: str, authorization: str | None, api_key: str | None) -> bool:
    """SGLang's rule for its ordinary routes (sglang/srt/utils/auth.py ``decide_request_auth``,
    level NORMAL): with --api-key every route but /health*, /ready* and /metrics* needs
    ``Authorization: Bearer <api key>``. Pure."""
    if not api_key or path.startswith(("/health", "/ready", "/metrics")):
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), api_key.encode())


def auth_middleware(api_key: str | None) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if bearer_allowed(request.path, request.headers.get("Authorization"), api_key):
            return await handler(request)
        return web.json_response({"error": "Unauthorized"}, status=401)

    return check


def build_app(state: ServerState, hostile: Hostile | None = None) -> web.Application:
    """The app; with ``hostile`` (tests only, see ``hostile.py``) the three routes kvgate's probe
    reads answer as an attacker would, and every other route stays the honest engine's."""
    app = web.Application(
        client_max_size=512 * 2**20, middlewares=[auth_middleware(state.launch["api_key"])]
    )
    app[STATE] = state
    server_info_handler: Handler = handle_server_info
    models_handler: Handler = handle_models
    if hostile is not None:
        server_info_handler = hostile.wrap(handle_server_info)
        models_handler = hostile.wrap(handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/health_generate", handle_health)
    app.router.add_get("/ready", handle_ready)
    app.router.add_get("/server_info", server_info_handler)
    app.router.add_get("/get_server_info", server_info_handler)
    app.router.add_get("/v1/models", models_handler)
    app.router.add_get("/v1/models/{model}", handle_model)
    app.router.add_get("/model_info", handle_model_info)
    app.router.add_get("/get_model_info", handle_model_info)
    app.router.add_post("/generate", handle_generate)
    app.router.add_put("/generate", handle_generate)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
    if state.engine.canary is not None:
        app.router.add_post("/kvgate/canary/corrupt", handle_canary_corrupt)
    if faults.enabled():
        engine = state.engine
        faults.install(
            app,
            engine.fail_every_transfer if engine.settings.role == "decode" else None,
        )
    if state.launch["enable_metrics"]:
        registry = build_registry(state.engine, state.served_model_name)

        async def handle_metrics(request: web.Request) -> web.Response:
            return web.Response(body=render(registry), content_type="text/plain", charset="utf-8")

        app.router.add_get("/metrics", handle_metrics)
    return app


async def handle_canary_corrupt(request: web.Request) -> web.Response:
    """Reference engine only (tests): the next decode's first slot is overwritten, so the KV
    canary (``--kv-canary log``) reports a violation exactly as SGLang logs one. With
    ``{"rank": r}`` (r >= 1, a multi-node engine) a slot of rank r is corrupted instead, and
    that rank logs the violation in its own log (ranks.py)."""
    state = request.app[STATE]
    canary = state.engine.canary
    assert canary is not None  # the route exists only with the canary on
    body = await request.json() if request.can_read_body else {}
    rank = body.get("rank", 0) if isinstance(body, dict) else 0
    if rank in (0, None):
        canary.corrupt_next = True
        return web.json_response({"corrupt_next": True})
    group = state.extra.get("ranks")
    if (
        not isinstance(rank, int)
        or group is None
        or not await group.send(rank, {"canary": "corrupt"})
    ):
        return error_response(f"rank {rank!r} is not a joined rank of this engine", 400)
    return web.json_response({"corrupt_rank": rank})


def now() -> float:
    return time.time()
