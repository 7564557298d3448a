"""Every generator checks or writes its outputs through one step (kvgate.gen.outputs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvgate.gen import chartgen, dashboards
from kvgate.gen.outputs import check_or_write


def test_check_names_every_stale_file_with_the_command_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current, stale, missing = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "d" / "c.yaml"
    current.write_text("same\n")
    stale.write_text("edited by hand\n")
    wanted = {current: "same\n", stale: "generated\n", missing: "generated\n"}

    assert check_or_write(wanted, check=True, command="make crds") == 1
    err = capsys.readouterr().err
    assert f"{stale} is out of date: run `make crds`" in err
    assert f"{missing} is out of date: run `make crds`" in err
    assert str(current) not in err
    assert stale.read_text() == "edited by hand\n" and not missing.exists()


def test_write_rewrites_only_the_stale_files_then_check_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current, missing = tmp_path / "a.yaml", tmp_path / "d" / "c.yaml"
    current.write_text("same\n")
    wanted = {current: "same\n", missing: "generated\n"}

    assert check_or_write(wanted, check=False, command="make crds") == 0
    assert capsys.readouterr().out == f"wrote {missing}\n"
    assert missing.read_text() == "generated\n"
    assert check_or_write(wanted, check=True, command="make crds") == 0


def test_the_chart_and_dashboard_generators_check_through_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert chartgen.main(["--chart-dir", str(tmp_path), "--check"]) == 1
    assert dashboards.main(["--dir", str(tmp_path / "boards"), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'templates' / chartgen.TEMPLATE_NAME} is out of date" in err
    assert "run `python -m kvgate.gen.dashboards`" in err
    assert not list(tmp_path.rglob("*.*"))  # --check wrote nothing
