"""`kvgate verify`: exit 0 safe, 1 unsafe, 2 cannot tell; output names each failed check."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from factories.local_http import serving_app
from kvgate.cmd.cli import main
from kvgate_engine.launcher import API_KEY_ENV

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engine"
KVGATE = Path(sys.executable).parent / "kvgate"


def fx(name: str) -> str:
    return str(FIXTURES / name)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_safe_engine_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--server-info",
        fx("server_info_0.5.23_decode.json"),
        "--models",
        fx("models_131072.json"),
        "--context-length",
        "131072",
        "--role",
        "decode",
    )
    assert code == 0
    assert out.startswith("SAFE: ")
    assert "KV pool 412,345 tokens (per DP rank: 412,345); required 131,072" in out


def test_incident_engine_exits_1_and_names_each_failed_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys,
        "--server-info",
        fx("server_info_0.5.23_incident_decode.json"),
        "--models",
        fx("models_1048576.json"),
        "--context-length",
        "1048576",
        "--role",
        "decode",
    )
    assert code == 1
    lines = out.splitlines()
    assert lines[0].endswith("fails 2 check(s)")
    assert lines[1] == (
        "  - KvPoolTooSmall: KV pool 681,280 tokens < context length 1,048,576 × headroom 1.0 "
        "(short by 367,296 tokens)"
    )
    assert lines[2].startswith("  - MaxInputTooShort: max_req_input_len 681,274 tokens")


def test_role_and_version_failures_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--server-info",
        fx("server_info_0.5.19_prefill.json"),
        "--context-length",
        "131072",
        "--role",
        "decode",
        "--min-version",
        "0.5.22",
    )
    assert code == 1
    assert "RoleMismatch: engine runs disaggregation_mode 'prefill', pod role is 'decode'" in out
    assert "EngineVersionTooOld: engine version 0.5.19 < minimum 0.5.22" in out


def test_headroom_changes_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--server-info", fx("server_info_0.5.23_decode.json"), "--context-length", "131072"]
    assert run(capsys, *common, "--headroom", "3.0")[0] == 0
    code, out, _ = run(capsys, *common, "--headroom", "3.2")
    assert code == 1
    assert "KV pool 412,345 tokens < context length 131,072 × headroom 3.2" in out


def test_json_output_is_a_stable_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--server-info",
        fx("server_info_0.5.23_dp2_uneven_decode.json"),
        "--models",
        fx("models_1048576.json"),
        "--context-length",
        "1048576",
        "--json",
    )
    result = json.loads(out)
    assert code == 1
    assert sorted(result) == [
        "command",
        "error",
        "exit_code",
        "findings",
        "message",
        "outcome",
        "reason",
        "report",
        "requirement",
        "schemaVersion",
        "source",
    ]
    assert (result["outcome"], result["exit_code"], result["reason"]) == (
        "Unsafe",
        1,
        "KvPoolTooSmall",
    )
    assert result["report"]["kv_pool_tokens_per_rank"] == [1_100_000, 1_000_000]
    assert result["report"]["kv_pool_tokens"] == 1_000_000
    assert result["requirement"] == {
        "context_length": 1_048_576,
        "headroom": 1.0,
        "required_pool_tokens": 1_048_576,
        "role": None,
        "min_version": "0.5.22",
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("<html>502 Bad Gateway</html>", "is not JSON (Expecting value at line 1 column 1)"),
        ('["a list"]', "is not a JSON object (it holds a list)"),
        (None, "cannot read "),
        (b"\x1f\x8b\x08\x00gzip", "is not UTF-8 text (byte 0x8b at offset 1: a binary file?)"),
    ],
    ids=["html", "json list", "missing file", "binary"],
)
def test_an_unreadable_saved_report_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | bytes | None, message: str
) -> None:
    path = tmp_path / "server_info.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    for flags in (
        ["--server-info", str(path)],
        ["--server-info", fx("server_info_0.5.23_decode.json"), "--models", str(path)],
    ):
        code, out, err = run(capsys, *flags, "--context-length", "131072")
        assert code == 2
        assert out == ""
        assert err.startswith(f"kvgate verify: {flags[-2]}: ")
        assert message in err
        assert "a saved /" in err  # the way out: what the flag takes


def test_missing_numbers_exit_2_never_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    info = json.loads(Path(fx("server_info_0.5.23_decode.json")).read_text())
    info["internal_states"][0]["memory_usage"]["token_capacity"] = "lots"
    path = tmp_path / "server_info.json"
    path.write_text(json.dumps(info))
    code, out, _ = run(capsys, "--server-info", str(path), "--context-length", "131072", "--json")
    assert code == 2
    assert json.loads(out)["outcome"] == "CannotTell"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--context-length", "0"], "--context-length: must be 1 or more (got 0)"),
        (
            ["--context-length", "10", "--headroom", "0.5"],
            "--headroom: must be a finite number >= 1.0 (got 0.5)",
        ),
        (
            ["--context-length", "10", "--headroom", "inf"],
            "--headroom: must be a finite number >= 1.0 (got inf); the pool must hold the "
            "context: 1.0 or more, e.g. 1.2",
        ),
        (
            ["--context-length", "131072", "--headroom", "1e308"],
            "--headroom: contextLength 131,072 × headroom 1e+308 is too large to compute; lower "
            "--context-length or --headroom",
        ),
        (
            ["--context-length", "10", "--min-version", "soon"],
            "--min-version: 'soon' is not a version; use one such as 0.5.22",
        ),
        (
            ["--context-length", "10", "--api-key", "k"],
            "--api-key: goes with --url (a saved report needs no key)",
        ),
    ],
)
def test_bad_arguments_exit_2_with_the_value(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, "--server-info", fx("server_info_0.5.23_decode.json"), *argv)
    assert code == 2
    assert message in err


@pytest.fixture
async def live_engine() -> AsyncIterator[str]:
    """A local engine-shaped server answering like the 0.5.23 incident decode engine."""
    info: Any = json.loads(Path(fx("server_info_0.5.23_incident_decode.json")).read_text())
    models: Any = json.loads(Path(fx("models_1048576.json")).read_text())
    app = web.Application()
    app.router.add_get("/server_info", _json_handler(info))
    app.router.add_get("/v1/models", _json_handler(models))
    async with serving_app(app) as url:
        yield url


def _json_handler(payload: Any) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(payload)

    return handler


async def _kvgate(*argv: str) -> tuple[int, str]:
    assert shutil.which(str(KVGATE)), f"{KVGATE} is not installed"
    process = await asyncio.create_subprocess_exec(
        str(KVGATE), "verify", *argv, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_live_url_unsafe_exits_1(live_engine: str) -> None:
    code, out = await _kvgate("--url", live_engine, "--context-length", "1048576", "--json")
    assert code == 1
    assert json.loads(out)["reason"] == "KvPoolTooSmall"


async def test_live_url_unsafe_when_the_engines_window_is_longer_than_the_context(
    live_engine: str,
) -> None:
    # The pool (681,280) holds 600,000, but the engine's own window is 1,048,576 and it takes
    # prompts up to 681,274 tokens: an engine paired with it and proven to hold 600,000 would
    # not hold them.
    code, out = await _kvgate("--url", live_engine, "--context-length", "600000", "--json")
    assert code == 1, out
    findings = [f["reason"] for f in json.loads(out)["findings"]]
    assert findings == ["ContextTooLong", "MaxInputTooLong"], out


async def test_unreachable_url_exits_2() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out = await _kvgate(
        "--url", f"http://127.0.0.1:{port}", "--context-length", "131072", "--timeout", "1"
    )
    assert code == 2
    assert out.startswith("CANNOT TELL: ")
    assert "EngineUnreachable: engine unreachable" in out


@pytest.fixture
async def engine_with_a_key() -> AsyncIterator[str]:
    """A safe engine that, like SGLang started with --api-key, answers 401 without the key."""
    info: Any = json.loads(Path(fx("server_info_0.5.23_decode.json")).read_text())
    models: Any = json.loads(Path(fx("models_131072.json")).read_text())

    def keyed(payload: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            if request.headers.get("Authorization") != "Bearer s3cret":
                return web.json_response({"error": "Unauthorized"}, status=401)
            return web.json_response(payload)

        return handler

    app = web.Application()
    app.router.add_get("/server_info", keyed(info))
    app.router.add_get("/v1/models", keyed(models))
    async with serving_app(app) as url:
        yield url


async def _kvgate_env(env: dict[str, str], *argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        str(KVGATE),
        "verify",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != API_KEY_ENV} | env,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_the_api_key_from_the_flag_or_the_environment_is_sent_as_a_bearer_token(
    engine_with_a_key: str,
) -> None:
    argv = ("--url", engine_with_a_key, "--context-length", "131072", "--json")
    code, out = await _kvgate_env({}, *argv, "--api-key", "s3cret")
    assert code == 0, out
    code, out = await _kvgate_env({API_KEY_ENV: "s3cret"}, *argv)
    assert code == 0, out


async def test_an_engine_that_wants_a_key_says_how_to_give_it(engine_with_a_key: str) -> None:
    argv = ("--url", engine_with_a_key, "--context-length", "131072", "--json")
    code, out = await _kvgate_env({}, *argv)
    verdict = json.loads(out)
    assert (code, verdict["reason"]) == (2, "EngineUnauthorized")
    assert verdict["message"] == (
        f"engine requires an API key: GET {engine_with_a_key}/server_info: HTTP 401; pass the "
        f"engine's --api-key with --api-key or ${API_KEY_ENV}"
    )
    code, out = await _kvgate_env({API_KEY_ENV: "wrong"}, *argv)
    verdict = json.loads(out)
    assert (code, verdict["reason"]) == (2, "EngineUnauthorized")
    assert verdict["message"] == (
        f"engine refused the API key from --api-key or ${API_KEY_ENV}: GET "
        f"{engine_with_a_key}/server_info: HTTP 401; pass the engine's own --api-key value"
    )


def test_json_has_the_schema_version_and_input_errors_are_objects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys,
        "--server-info",
        fx("server_info_0.5.23_decode.json"),
        "--context-length",
        "8",
        "--json",
    )
    payload = json.loads(out)
    assert (
        payload["schemaVersion"],
        payload["command"],
        payload["exit_code"],
        payload["error"],
    ) == (
        1,
        "verify",
        code,
        None,
    )
    code, out, err = run(
        capsys,
        "--server-info",
        fx("server_info_0.5.23_decode.json"),
        "--context-length",
        "8",
        "--headroom",
        "inf",
        "--json",
    )
    assert code == 2 and err == ""
    assert json.loads(out) == {
        "schemaVersion": 1,
        "command": "verify",
        "exit_code": 2,
        "error": {
            "input": "--headroom",
            "message": "must be a finite number >= 1.0 (got inf); the pool must hold the "
            "context: 1.0 or more, e.g. 1.2",
        },
    }
