"""The shared world's scheduling unit: the real-SGLang files are one (no worker waits idle in
the real-engine flock), every other file its own."""

from __future__ import annotations

from pathlib import Path

from kvgate_e2e.file_groups import REAL_SGLANG_FILES, REAL_SGLANG_SCOPE, scope_of

TESTS = Path(__file__).resolve().parent


def test_the_real_sglang_files_share_one_unit_and_other_files_keep_their_own() -> None:
    real = "e2e/tests/test_scenario_real_engine.py::test_x"
    incident = "e2e/tests/test_scenario_real_incident.py::test_y[a::b]"
    assert scope_of(real) == scope_of(incident) == REAL_SGLANG_SCOPE
    assert scope_of("e2e/tests/test_chaos.py::test_z") == "e2e/tests/test_chaos.py"
    assert scope_of("e2e/tests/test_scenario_progressive.py::t[p]") == (
        "e2e/tests/test_scenario_progressive.py"
    )


def test_every_grouped_file_exists() -> None:
    """A renamed real-SGLang file would silently fall out of the group."""
    for name in REAL_SGLANG_FILES:
        assert (TESTS / name).is_file(), name
