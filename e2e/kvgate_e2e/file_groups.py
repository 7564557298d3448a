"""Files that must run on one pytest-xdist worker, one after the other (the shared world's
``--dist loadfile`` run).

The real-SGLang scenarios each start a real prefill/decode pair on CPU, about 6 GB, and hold a
flock so that two pairs never run at once (``kvgate_e2e.real_engine``). On two workers, the
second file's test would sit in that flock, holding its worker idle for the first file's whole
run (four to five minutes here). Grouped into one scope, one worker runs them back to back and
the others go on with the rest of the tier.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

REAL_SGLANG_FILES = frozenset({"test_scenario_real_engine.py", "test_scenario_real_incident.py"})
REAL_SGLANG_SCOPE = "e2e/tests/<the real-SGLang scenarios>"


def scope_of(nodeid: str) -> str:
    """The work unit of ``nodeid``: its file, or the one scope of the real-SGLang files."""
    file = nodeid.split("::", 1)[0]
    return REAL_SGLANG_SCOPE if PurePosixPath(file).name in REAL_SGLANG_FILES else file


class GroupedFileScheduling(LoadFileScheduling):  # type: ignore[misc]
    """``--dist loadfile`` with the real-SGLang files as one unit (order kept: with
    ``--no-loadscope-reorder`` the scopes go out in the collection's order)."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
