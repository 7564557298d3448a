"""Bare numeric timing bounds in e2e code (``kvgate_e2e.bounds_audit``): the tool finds them, and
the files whose bounds were derived or named keep none (no cluster)."""

from __future__ import annotations

from pathlib import Path

from kvgate_e2e.bounds_audit import bare_bounds

TESTS = Path(__file__).resolve().parent
# The tests and their harness. Not e2e/bench: a benchmark measures and reports, and its waits
# only stop a run that hangs.
AUDITED = (TESTS, TESTS.parent / "kvgate_e2e")


SAMPLE = """
poll_until("the pod Ready", ready, 30)
poll_until("the pod Ready", ready, READY_DEADLINE)
poll_until("the pod Ready", ready, 30)  # the kubelet's 10 s probe period, three times
# the gate's own period, twice
deadline_loop("gate False", gate_false, 4)
wait_md_ready(world, "md", ns, 120, "the revision")
urllib.request.urlopen(url, timeout=2)
http_json(url, timeout=0)
Deadline(15)
seen.wait(probe, 90)
fired_after(prometheus, "Alert", labels, cause, deadline=60)
"""


def test_the_audit_finds_bare_numbers_given_as_wait_deadlines_and_timeouts(
    tmp_path: Path,
) -> None:
    found = bare_bounds(tmp_path / "sample.py", SAMPLE)
    assert [(b.line, b.value) for b in found] == [
        (2, 30),
        (7, 120),
        (8, 2),
        (10, 15),
        (11, 90),
        (12, 60),
    ]
    assert "poll_until" in found[0].code


def test_no_e2e_file_has_a_bare_bound() -> None:
    """Every bound in the e2e tests and their harness is measured in the run or a named deadline
    (kvgate_e2e.deadlines, or a constant of the file with its reason)."""
    files = sorted(p for folder in AUDITED for p in folder.rglob("*.py"))
    assert len(files) > 100
    found = [str(bound) for path in files for bound in bare_bounds(path)]
    assert found == []
