"""``kvgate_engine.redact``: the secrets SGLang's ``/server_info`` carries never get past the one
place kvgate reads the document (``kvgate_engine.probe.read_server_info``)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from kvgate_engine.probe import parse_report, project_server_info, read_server_info
from kvgate_engine.redact import (
    REDACTED,
    is_secret_field,
    is_secret_flag,
    redact_argv,
    redact_command,
    redact_server_info,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engine"
API_KEY = "sk-live-7f3a9c21e4b8"
ADMIN_KEY = "adm-0d9e8c7b6a5f"
SSL_PASSWORD = "qv7wz kp9phrase"  # a space: one argument, two words
LAUNCH_ARGV = [
    *("--model-path", "/models/llama-3.1-8b", "--port", "30000"),
    *("--api-key", API_KEY, f"--admin-api-key={ADMIN_KEY}"),
    *("--ssl-keyfile", "/tls/key.pem", "--ssl-keyfile-password", SSL_PASSWORD),
    *("--context-length", "131072"),
]
SECRETS = (API_KEY, ADMIN_KEY, SSL_PASSWORD)


def with_secrets(doc: dict[str, Any], launch_command: object) -> dict[str, Any]:
    """A real-shaped document (a 0.5.23 fixture) from an engine started with a key: SGLang puts
    the secrets at the top level, in each DP rank's state and in launch_command."""
    secrets = {"api_key": API_KEY, "admin_api_key": ADMIN_KEY, "ssl_keyfile_password": SSL_PASSWORD}
    states = [{**state, **secrets} for state in doc["internal_states"]]
    return {**doc, **secrets, "launch_command": launch_command, "internal_states": states}


def engine_doc(launch_command: object) -> dict[str, Any]:
    return with_secrets(
        json.loads((FIXTURES / "server_info_0.5.23_decode.json").read_text()), launch_command
    )


def assert_no_secret(value: object) -> None:
    text = json.dumps(value)
    for secret in (*SECRETS, *SSL_PASSWORD.split()):
        assert secret not in text, f"{secret!r} in {text}"


# ---------------------------------------------------------------------------------------------
# The document
# ---------------------------------------------------------------------------------------------

LAUNCH_COMMANDS = {
    # SGLang 0.5.23: the flags joined with spaces, nothing quoted.
    "string, as SGLang joins it": " ".join(LAUNCH_ARGV),
    # The reference engine: shell-quoted, with the interpreter in front.
    "string, shell-quoted": shlex.join(["python3", "-m", "sglang.launch_server", *LAUNCH_ARGV]),
    "list": list(LAUNCH_ARGV),
    "Engine() call": (
        f"Engine(model_path='/models/llama-3.1-8b', api_key={API_KEY!r}, "
        f"admin_api_key={ADMIN_KEY!r}, ssl_keyfile_password={SSL_PASSWORD!r}, log_level='error')"
    ),
}


@pytest.mark.parametrize("command", LAUNCH_COMMANDS.values(), ids=LAUNCH_COMMANDS.keys())
def test_no_secret_of_an_engine_started_with_a_key_survives_redaction(command: object) -> None:
    redacted = redact_server_info(engine_doc(command))
    assert_no_secret(redacted)
    assert isinstance(redacted, dict)
    for doc in (redacted, redacted["internal_states"][0]):
        assert doc["api_key"] == doc["admin_api_key"] == doc["ssl_keyfile_password"] == REDACTED
    # What is not secret stays as it was: the command still names its flags and its model.
    assert "/models/llama-3.1-8b" in json.dumps(redacted["launch_command"])
    assert "--context-length" in json.dumps(redacted["launch_command"]) or isinstance(command, str)


def test_what_kvgate_reads_of_the_document_is_unchanged_by_redaction() -> None:
    doc = engine_doc(" ".join(LAUNCH_ARGV))
    plain = json.loads((FIXTURES / "server_info_0.5.23_decode.json").read_text())
    assert parse_report(doc, None) == parse_report(plain, None)
    assert project_server_info(redact_server_info(doc)) == project_server_info(plain)


def test_a_field_without_a_secret_stays_none_and_an_unrelated_field_is_untouched() -> None:
    doc = {"api_key": None, "admin_api_key": "", "tp_size": 8, "served_model_name": "m"}
    assert redact_server_info(doc) == {
        "api_key": None,
        "admin_api_key": REDACTED,
        "tp_size": 8,
        "served_model_name": "m",
    }


@pytest.mark.parametrize("doc", [None, 3, "text", [1, {"api_key": "x"}], []])
def test_a_document_that_is_not_an_object_is_redacted_where_it_holds_objects(doc: object) -> None:
    redacted = redact_server_info(doc)
    assert '"x"' not in json.dumps(redacted)
    assert type(redacted) is type(doc)


def test_a_secret_in_any_nested_object_is_redacted() -> None:
    doc = {"kv_events": {"publisher": {"hf_token": "hf_abc", "password": "p"}}, "x": [{"k": 1}]}
    assert redact_server_info(doc) == {
        "kv_events": {"publisher": {"hf_token": REDACTED, "password": REDACTED}},
        "x": [{"k": 1}],
    }


def test_a_secret_the_fields_hold_is_taken_out_of_launch_command_in_any_spelling() -> None:
    # The value appears unflagged (a config text, an abbreviation the list does not know).
    doc = {"api_key": API_KEY, "launch_command": f"--foo {API_KEY} --bar=x{API_KEY}y"}
    redacted = redact_server_info(doc)
    assert redacted == {
        "api_key": REDACTED,
        "launch_command": "--foo <redacted> --bar=x<redacted>y",
    }


def test_the_input_document_is_not_changed() -> None:
    doc = engine_doc(list(LAUNCH_ARGV))
    before = json.dumps(doc)
    redact_server_info(doc)
    assert json.dumps(doc) == before


# ---------------------------------------------------------------------------------------------
# launch_command
# ---------------------------------------------------------------------------------------------

ARGV_CASES = [
    (["--api-key", "S"], ["--api-key", REDACTED]),
    (["--api-key=S"], [f"--api-key={REDACTED}"]),
    (["--admin-api-key", "S", "--tp-size", "8"], ["--admin-api-key", REDACTED, "--tp-size", "8"]),
    (["--admin-api-key=S=T"], [f"--admin-api-key={REDACTED}"]),
    (["--ssl-keyfile-password", "S"], ["--ssl-keyfile-password", REDACTED]),
    (["--watermark-config", '{"key":"S"}'], ["--watermark-config", REDACTED]),
    (
        ["--hicache-storage-backend-extra-config=S"],
        [f"--hicache-storage-backend-extra-config={REDACTED}"],
    ),
    (["--api_key", "S"], ["--api_key", REDACTED]),
    # argparse (SGLang's parser) reads a unique prefix of a flag as that flag.
    (["--admin-api", "S"], ["--admin-api", REDACTED]),
    (["--ssl-keyfile-pass=S"], [f"--ssl-keyfile-pass={REDACTED}"]),
    # ... but an exact flag before a prefix: these name paths, not secrets.
    (["--ssl-keyfile", "/k.pem", "--model", "m"], ["--ssl-keyfile", "/k.pem", "--model", "m"]),
    (["--hicache-storage-backend", "file"], ["--hicache-storage-backend", "file"]),
    # A flag a later release adds, named like a secret.
    (
        ["--hf-token", "S", "--some-password=S"],
        ["--hf-token", REDACTED, f"--some-password={REDACTED}"],
    ),
    # The flag last, without its value: nothing to redact, nothing lost.
    (["--tp-size", "8", "--api-key"], ["--tp-size", "8", "--api-key"]),
    (
        ["--max-total-tokens", "5", "--", "--api-key"],
        ["--max-total-tokens", "5", "--", "--api-key"],
    ),
]


@pytest.mark.parametrize(("argv", "expected"), ARGV_CASES, ids=[" ".join(a) for a, _ in ARGV_CASES])
def test_redact_argv(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(("argv", "expected"), ARGV_CASES, ids=[" ".join(a) for a, _ in ARGV_CASES])
def test_a_launch_command_string_is_redacted_like_its_argv(
    argv: list[str], expected: list[str]
) -> None:
    assert redact_command(" ".join(argv)) == " ".join(expected)
    assert redact_server_info({"launch_command": argv}) == {"launch_command": expected}


def test_a_quoted_value_with_spaces_is_redacted_whole() -> None:
    command = shlex.join(["--api-key", "two words", "--port", "1"])
    assert redact_command(command) == f"--api-key {REDACTED} --port 1"


def test_unbalanced_quotes_are_split_at_whitespace() -> None:
    assert redact_command("--api-key it's --port 1") == f"--api-key {REDACTED} --port 1"


def test_the_engine_call_form_redacts_keyword_values() -> None:
    command = "Engine(model_path='m', api_key='a\\'b', admin_api_key=\"c\", tp_size=2)"
    assert redact_command(command) == (
        f"Engine(model_path='m', api_key={REDACTED!r}, admin_api_key={REDACTED!r}, tp_size=2)"
    )


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("admin_api_key", True),
        ("ssl_keyfile_password", True),
        ("watermark_key_b", True),
        ("hf_token", True),
        ("model_loader_extra_config", True),
        ("ssl_keyfile", False),
        ("max_total_num_tokens", False),
        ("token_capacity", False),
        ("max_req_input_len", False),
        ("served_model_name", False),
        ("kv_events", False),
    ],
)
def test_is_secret_field(name: str, secret: bool) -> None:
    assert is_secret_field(name) is secret


@pytest.mark.parametrize(
    ("flag", "secret"),
    [
        ("--api-key", True),
        ("--admin", True),
        ("--ssl-keyfile", False),
        ("--", False),
        ("-k", False),
    ],
)
def test_is_secret_flag(flag: str, secret: bool) -> None:
    assert is_secret_flag(flag) is secret


# ---------------------------------------------------------------------------------------------
# The one place kvgate reads the document
# ---------------------------------------------------------------------------------------------


def test_read_server_info_keeps_only_what_kvgate_checks_and_no_secret() -> None:
    kept = read_server_info(engine_doc(" ".join(LAUNCH_ARGV)))
    assert_no_secret(kept)
    assert isinstance(kept, dict)
    assert "launch_command" not in kept and "api_key" not in kept
    assert kept["internal_states"] == [
        {"disaggregation_mode": "decode", "memory_usage": {"token_capacity": 412_345}}
    ]
