"""A missing control-plane build fails the e2e tier under CI instead of skipping it (a green
`make test` or CI run means the e2e tier ran). No cluster: an empty build directory stands in for
a clone whose build is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvgate_e2e.build_artifacts import BIN_DIR_ENV, e2e_required_by

SMOKE = Path(__file__).resolve().parent / "test_cluster_smoke.py"
# A nested pytest run of SMOKE with no binaries: it collects, then skips or fails at once.
NESTED_RUN_TIMEOUT = 120


@pytest.mark.parametrize(
    ("env", "required_by"),
    [
        ({}, None),
        ({"CI": ""}, None),
        ({"CI": "true"}, "CI='true' is set"),
        ({"CI": "1", "KVGATE_REQUIRE_E2E": "0"}, "CI='1' is set"),
        ({"KVGATE_REQUIRE_E2E": "1"}, "KVGATE_REQUIRE_E2E=1 is set"),
        ({"KVGATE_REQUIRE_E2E": "0"}, None),
    ],
)
def test_the_tier_is_required_under_ci_and_make_test(
    env: dict[str, str], required_by: str | None
) -> None:
    assert e2e_required_by(env) == required_by


def _run_tier(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "KVGATE_REQUIRE_E2E")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SMOKE)],
        env={**base, BIN_DIR_ENV: str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=NESTED_RUN_TIMEOUT,
        check=False,
    )


def test_a_missing_build_fails_the_e2e_tier_under_ci(tmp_path: Path) -> None:
    proc = _run_tier(tmp_path, CI="true")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "CI='true' is set" in out and "control-plane binaries not found" in out, out
    assert "skipped" not in out, out


def test_a_missing_build_skips_the_e2e_tier_outside_ci(tmp_path: Path) -> None:
    proc = _run_tier(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "skipped" in out, out
