"""The secrets an SGLang ``/server_info`` document carries, taken out before kvgate reads it. Pure.

SGLang's ``/server_info`` (and its alias ``/get_server_info``) is ``ServerArgs.resolved_dict()``
plus live state (sglang/srt/utils/common.py ``build_server_info``): every flag's value, the
secrets among them, at the top level and again in each DP rank's ``internal_states`` entry. SGLang
0.5.23 hides only its watermark keys (``redact_watermark_secrets``); ``api_key``,
``admin_api_key`` and ``ssl_keyfile_password`` come back as given, and ``launch_command`` (since
0.5.20; the command line joined with spaces, or ``Engine(api_key='...', ...)`` for the Python
API) repeats every flag, ``--api-key X`` included (upstream sgl-project/sglang#37457).

``redact_server_info`` replaces, anywhere in the document:

- the value of every field that holds a secret or may embed one: the names in
  ``SECRET_FIELDS``, and any name that ends in ``key``, ``password``, ``passwd``, ``secret``,
  ``token`` or ``credential(s)`` (``hf_token``, ``watermark_key_b``, a field a later release adds);
- inside ``launch_command`` (a string or a list of arguments), the value of each such flag in
  every spelling SGLang's parser reads: ``--api-key X``, ``--api-key=X``, a prefix of the flag
  (``--admin-api X``: argparse takes any unique prefix), and ``api_key='X'`` in the
  ``Engine(...)`` form; and every secret value the document's own fields held, wherever it stands
  in the command (a value with spaces split across arguments).

kvgate then keeps only the few fields it checks (``kvgate_engine.probe.project_server_info``),
none of them a secret; the redaction holds whatever that list becomes.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
# ServerArgs fields (SGLang 0.5.19-0.5.23, sglang/srt/arg_groups/fields/) that hold a secret, or a
# JSON/config text that may embed one (a storage backend's or model loader's credentials).
SECRET_FIELDS = frozenset(
    {
        "api_key",
        "admin_api_key",
        "ssl_keyfile_password",
        "watermark_key",
        "watermark_key_b",
        "watermark_config",
        "hicache_storage_backend_extra_config",
        "model_loader_extra_config",
    }
)
SECRET_NAME = re.compile(
    r"(?:^|_)(?:key|password|passwd|secret|token|credentials?)(?:_[a-z0-9])?$", re.IGNORECASE
)
# SGLang flags (or aliases) that are a prefix of a secret flag but name something else: argparse
# takes an exact match before any prefix (``--ssl-keyfile PATH`` is the key file's path).
PLAIN_FLAGS_BEFORE_SECRETS = frozenset({"ssl_keyfile", "hicache_storage_backend", "model"})
# The document field whose text repeats the command line.
COMMAND_FIELD = "launch_command"
# ``name='value'`` / ``name="value"`` / ``name=value`` in SGLang's ``Engine(k=v!r, ...)`` text.
KEYWORD_ARG = re.compile(
    r"""(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?P<value>'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"|[^,)\s]*)"""
)


def is_secret_field(name: str) -> bool:
    """A document field (or ServerArgs field) whose value kvgate never keeps."""
    return name in SECRET_FIELDS or SECRET_NAME.search(name) is not None


@functools.lru_cache(maxsize=4096)
def is_secret_flag(flag: str) -> bool:
    """``--api-key``, ``--api_key``, or a prefix argparse would read as a secret flag
    (``--admin-api``); never a lone ``--``."""
    if not flag.startswith("--") or len(flag) <= 2:
        return False
    name = flag[2:].replace("-", "_")
    if is_secret_field(name):
        return True
    if name in PLAIN_FLAGS_BEFORE_SECRETS:
        return False
    return any(field.startswith(name) for field in SECRET_FIELDS)


def _scrub(text: str, values: Sequence[str]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return text


def redact_argv(argv: Sequence[str], values: Sequence[str] = ()) -> list[str]:
    """A command line with the value of every secret flag replaced (``--api-key X`` and
    ``--api-key=X``), and ``values`` (known secrets) replaced wherever they stand."""
    out: list[str] = []
    redact_next = False
    for item in argv:
        if redact_next:
            out.append(REDACTED)
            redact_next = False
            continue
        flag, eq, _ = item.partition("=")
        if flag.startswith("--") and is_secret_flag(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(item)
                redact_next = True
            continue
        out.append(_scrub(item, values))
    return out


def _quote(item: str) -> str:
    return item if item.endswith(REDACTED) else shlex.quote(item)


def redact_command(command: str, values: Sequence[str] = ()) -> str:
    """``launch_command`` as text, secrets replaced: the ``Engine(api_key='X', ...)`` form, else a
    command line, split as the shell would when it can (a quoted value with spaces is one
    argument), else at whitespace (SGLang joins argv with spaces and quotes nothing)."""
    command = _scrub(command, values)
    if command.startswith("Engine("):
        return KEYWORD_ARG.sub(
            lambda m: f"{m['name']}={REDACTED!r}" if is_secret_field(m["name"]) else m[0], command
        )
    if any(quote in command for quote in "'\"\\"):
        with contextlib.suppress(ValueError):  # unbalanced quotes: split at whitespace
            return " ".join(_quote(item) for item in redact_argv(shlex.split(command)))
    parts = re.split(r"(\s+)", command)
    parts[0::2] = redact_argv(parts[0::2])
    return "".join(parts)


_SCALARS = (str, int, float, bool, type(None))


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    return is_secret_field(key)


class _Walk:
    """One pass over the document: secret fields replaced and their values collected; each
    ``launch_command`` redacted once every secret value is known."""

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.commands: list[tuple[dict[Any, object], Any, str | list[Any]]] = []

    def secrets_in(self, value: object) -> None:
        if isinstance(value, str):
            if value:
                self.values.add(value)
        elif isinstance(value, Mapping):
            for item in value.values():
                self.secrets_in(item)
        elif isinstance(value, list):
            for item in value:
                self.secrets_in(item)

    def copy(self, value: object) -> object:
        if isinstance(value, _SCALARS):
            return value
        if isinstance(value, list):
            return [item if isinstance(item, _SCALARS) else self.copy(item) for item in value]
        if not isinstance(value, Mapping):
            return value
        out: dict[Any, object] = {}
        for key, item in value.items():
            if isinstance(key, str) and _secret_key(key):
                self.secrets_in(item)
                out[key] = None if item is None else REDACTED
            elif key == COMMAND_FIELD and isinstance(item, str | list):
                self.commands.append((out, key, item))
            else:
                out[key] = item if isinstance(item, _SCALARS) else self.copy(item)
        return out

    def finish(self) -> None:
        values = sorted(self.values, key=len, reverse=True)  # a secret inside another: whole
        for out, key, command in self.commands:
            if isinstance(command, str):
                out[key] = redact_command(command, values)
            else:
                out[key] = redact_argv([str(item) for item in command], values)


def redact_server_info(doc: object) -> object:
    """A copy of a ``/server_info`` document with every secret replaced by ``<redacted>``
    (``None`` stays ``None``: the engine has no such secret). Anything that is not a JSON
    object comes back as it is."""
    walk = _Walk()
    out = walk.copy(doc)
    walk.finish()
    return out
