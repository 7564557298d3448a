"""How the one-shot ``kvgate`` commands report: one JSON object with ``--json``, else text.

Every ``--json`` object, success or failure, carries ``schemaVersion`` (this module's
SCHEMA_VERSION; raised when a key is removed or changes meaning), ``command``, ``exit_code`` and
``error``: ``null``, or ``{"input": <flag or file>, "message": <what is wrong and the way out>}``.
An input or usage error (exit 2) or an internal error (exit 3) has no other key; each command's
own keys are in docs/operating.md. Without ``--json`` a failure is one line on stderr:
``kvgate <command>: <input>: <message>``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1


def envelope(
    command: str,
    exit_code: int,
    payload: Mapping[str, Any] | None = None,
    *,
    error: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The ``--json`` object: the common keys, then the command's own."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "command": command,
        "exit_code": exit_code,
        "error": None if error is None else {"input": error[0], "message": error[1]},
        **(payload or {}),
    }


def print_json(document: Mapping[str, Any], *, sort_keys: bool = True) -> None:
    """One JSON document on stdout."""
    print(json.dumps(document, indent=2, sort_keys=sort_keys, ensure_ascii=False))


def report_failure(
    command: str, exit_code: int, input_name: str, message: str, *, as_json: bool
) -> int:
    """Say why the command failed, as JSON on stdout or one line on stderr; returns the code."""
    if as_json:
        print_json(envelope(command, exit_code, error=(input_name, message)))
    else:
        where = f"{input_name}: " if input_name else ""
        print(f"kvgate {command}: {where}{message}", file=sys.stderr)
    return exit_code
