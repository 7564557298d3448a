"""What the one-shot ``kvgate`` commands read from their user, and the error that names it.

A file is read up to a cap and refused above it (never read to its end first), decoded as UTF-8
(a binary file is named as one), and parsed as JSON within the same caps as an engine's live
answer (:mod:`kvgate_engine.untrusted`): a value count checked before parsing, nesting bounded,
``NaN`` and ``Infinity`` refused (they are not JSON, and the webhook refuses them too). Every
problem is an :class:`InputError` naming the flag or file, the value, and what to pass instead;
the command line turns it into exit code 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from kvgate_engine.untrusted import BodyLimits, count_values, size_text

# A model's config.json is 1-10 KiB; the cap leaves room for the largest published ones.
CONFIG_LIMITS = BodyLimits.for_bytes(2**20)
CONFIG_FILE = "the model's config.json"


class InputError(Exception):
    """An input the command cannot use (exit 2). ``input`` names it as the user wrote it (a flag,
    a file); ``message`` says what is wrong with it, with the value, and the way out."""

    def __init__(self, input_name: str, message: str) -> None:
        super().__init__(f"{input_name}: {message}" if input_name else message)
        self.input = input_name
        self.message = message


def _lead(input_name: str, path: str) -> str:
    """How a message starts: ``/x/config.json is ...`` after a flag, ``is ...`` after the path."""
    return "" if input_name == path else f"{path} "


def read_bytes(path: str, *, input_name: str, max_bytes: int, what: str, cap: str = "") -> bytes:
    """At most ``max_bytes`` of the file (``-``: standard input); InputError above it, or when
    it cannot be read. ``cap`` says where the cap comes from, for the message."""
    subject = "it" if input_name == path else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(max_bytes + 1)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise InputError(input_name, f"cannot read {subject}: {reason}; pass {what}") from None
    if len(data) > max_bytes:
        reason = f" ({cap})" if cap else ""
        raise InputError(
            input_name,
            f"{_lead(input_name, path)}is larger than the {size_text(max_bytes)} kvgate "
            f"reads{reason}; pass {what}",
        )
    return data


def decode_text(data: bytes, *, input_name: str, path: str, what: str) -> str:
    """The bytes as UTF-8 text (a leading byte-order mark dropped); InputError for binary."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(
            input_name,
            f"{_lead(input_name, path)}is not UTF-8 text (byte 0x{data[error.start]:02x} at "
            f"offset {error.start:,}: a binary file?); pass {what}",
        ) from None
    if not text.strip():
        raise InputError(input_name, f"{_lead(input_name, path)}is empty; pass {what}")
    return text


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true or false"
    if value is None:
        return "null"
    return "a number"


def load_json(path: str, *, input_name: str, limits: BodyLimits, what: str) -> Mapping[str, Any]:
    """The file's JSON object, read and parsed within ``limits``; InputError otherwise."""
    data = read_bytes(path, input_name=input_name, max_bytes=limits.max_bytes, what=what)
    text = decode_text(data, input_name=input_name, path=path, what=what)
    lead = _lead(input_name, path)
    values = count_values(data)
    if values > limits.max_values:
        raise InputError(
            input_name,
            f"{lead}holds {values:,} JSON values or more, above the {limits.max_values:,} "
            f"kvgate parses; pass {what}",
        )
    try:
        document = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise InputError(input_name, f"{lead}is nested too deeply to read; pass {what}") from None
    except json.JSONDecodeError as error:
        raise InputError(
            input_name,
            f"{lead}is not JSON ({error.msg} at line {error.lineno} column {error.colno}); "
            f"pass {what}",
        ) from None
    except ValueError as error:  # NaN/Infinity, an integer beyond Python's digit limit
        detail = str(error)
        if "integer string conversion" in detail:
            detail = f"a number of more than {sys.get_int_max_str_digits():,} digits"
        raise InputError(input_name, f"{lead}is not JSON ({detail}); pass {what}") from None
    if not isinstance(document, dict):
        raise InputError(
            input_name,
            f"{lead}is not a JSON object (it holds {_kind(document)}); pass {what}",
        )
    return document
