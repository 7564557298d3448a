"""SGLang's request logging (``--log-requests``) for the requests the reference engine receives.

SGLang's tokenizer manager logs every request it receives at INFO
(``srt/utils/request_logger.py:RequestLogger.log_received_request``, text format):
``Receive: obj=GenerateReqInput(rid='...', text='...', ...)``, each field rendered by
``_dataclass_to_string_truncated``: a string with ``repr`` (over ``max_length``, half of it from
each end), a list with ``str``, a dict key by key. ``--log-requests-level`` picks what is shown
(``_compute_metadata``): 0 leaves out the inputs and ``sampling_params``, 1 the inputs, 2 cuts
values at 2,048, 3 shows everything. The fields here are those this engine reads, in
GenerateReqInput's order.

So client-chosen text (the request id, the prompt) reaches the engine's log as it does on
SGLang, quoted; kvgate's KV-canary reader must not take it for SGLang's own record.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("sglang.srt.utils.request_logger")

LEVELS = (0, 1, 2, 3)
# GenerateReqInput's fields that the reference engine reads, in the dataclass's order.
FIELDS = (
    "rid",
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
)
_INPUTS = frozenset({"text", "input_ids"})


def _limits(level: int) -> tuple[int, frozenset[str]]:
    """``_compute_metadata``: (max_length, skip_names) for a --log-requests-level."""
    if level == 0:
        return 1 << 30, _INPUTS | {"sampling_params"}
    if level == 1:
        return 1 << 30, _INPUTS
    if level == 2:
        return 2048, frozenset()
    return 1 << 30, frozenset()


def render(value: Any, max_length: int) -> str:
    """``_dataclass_to_string_truncated`` for the values a JSON body holds."""
    if isinstance(value, str):
        if len(value) > max_length:
            half = max_length // 2
            return f"{value[:half]!r} ... {value[-half:]!r}"
        return repr(value)
    if isinstance(value, list | tuple):
        if len(value) > max_length:
            half = max_length // 2
            return f"{value[:half]} ... {value[-half:]}"
        return str(value)
    if isinstance(value, dict):
        parts = [f"'{k}': {render(v, max_length)}" for k, v in value.items()]
        return "{" + ", ".join(parts) + "}"
    return str(value)


def received(body: dict[str, Any], level: int) -> str:
    """The message SGLang logs for a request it received (without its log prefix)."""
    max_length, skip = _limits(level)
    parts = [
        f"{name}={render(body.get(name, False if name == 'stream' else None), max_length)}"
        for name in FIELDS
        if name not in skip
    ]
    return f"Receive: obj=GenerateReqInput({', '.join(parts)})"


def log_received(body: dict[str, Any], level: int) -> None:
    log.info("%s", received(body, level))
