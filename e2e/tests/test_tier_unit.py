"""The e2e tier's two worlds (kvgate_e2e.tier): which files run in the second world, the two
pytest commands, and one exit code and one output for both sessions."""

from __future__ import annotations

import sys
from pathlib import Path

import conftest
import pytest
from kvgate_e2e import tier

TESTS = Path(__file__).resolve().parent


def test_every_second_world_file_exists_and_would_be_alone_in_the_shared_world() -> None:
    """A renamed file would silently fall back into the shared world; a second-world file must
    be one that had to run alone there (--one-world runs it there again)."""
    for name in tier.SECOND_WORLD:
        assert (TESTS / name).is_file(), name
        lone = name in conftest.ALONE or "lws: World" in (TESTS / name).read_text()
        assert lone, f"{name} is in tier.SECOND_WORLD but has no lone test (conftest.ALONE, lws)"


def test_a_directory_splits_into_the_shared_files_and_the_second_worlds() -> None:
    shared, second = tier.split(tier.expand([str(TESTS)]))
    assert {f.name for f in second} == set(tier.SECOND_WORLD)
    assert not {f.name for f in shared} & set(tier.SECOND_WORLD)
    assert len(shared) + len(second) == len(list(TESTS.glob("test_*.py")))
    assert len(set(shared)) == len(shared)


def test_one_world_keeps_every_file_in_the_shared_world() -> None:
    files = tier.expand([str(TESTS / "test_chaos.py"), str(TESTS / "test_quick_start.py")])
    assert tier.split(files, one_world=True) == (files, [])
    assert [f.name for f in tier.split(files)[1]] == ["test_chaos.py"]


def test_the_shared_session_has_the_workers_and_the_second_none() -> None:
    shared, second = tier.commands([Path("a.py")], [Path("b.py")], workers=3, python="py")
    assert shared is not None and second is not None
    assert shared[:3] == ["py", "-m", "pytest"] and shared[-1] == "a.py"
    assert shared[shared.index("-n") + 1] == "3" and "loadfile" in shared
    assert "-n" not in second and second[-1] == "b.py"
    assert "no:cacheprovider" in second  # the two sessions do not race for .pytest_cache
    assert tier.commands([], [Path("b.py")], workers=3) == (
        None,
        tier.commands([], [Path("b.py")], workers=3)[1],
    )


@pytest.mark.parametrize(("codes", "expected"), [([0, 0], 0), ([0, 1], 1), ([2, 1], 2)])
def test_the_tier_fails_when_either_session_fails(codes: list[int], expected: int) -> None:
    assert tier.first_failure(codes) == expected


def test_both_sessions_run_at_once_and_the_second_ones_output_is_printed_at_the_end(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each session waits for a file only the other writes: they can only finish together."""
    a, b = tmp_path / "a", tmp_path / "b"
    wait = "import pathlib,sys,time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.01)"
    shared = [sys.executable, "-c", f"open({str(a)!r}, 'w').close()\n{wait}", str(b)]
    second = [
        sys.executable,
        "-c",
        f"open({str(b)!r}, 'w').close()\n{wait}\nprint('second says')\nsys.exit(3)",
        str(a),
    ]
    log = tmp_path / "second.log"
    assert tier.run(shared, second, log) == 3
    out = capfd.readouterr().out
    assert "---- the second world's session (exit 3) ----" in out
    assert out.index("second says") > out.index("exit 3")
