"""docs/planning.md's "Plan before you deploy" example reproduces from its command."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from kvgate.cmd.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "planning.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _example() -> tuple[list[str], str, str]:
    """(argv after `kvgate`, the printed output, the picture the doc shows, as a path from the
    repository root)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Plan before you deploy\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n\$ (kvgate plan [^\n]*)\n(.*?)```", section, re.S)
    assert block, "the section has no ```console example"
    picture = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", section)
    assert picture, "the section shows no picture"
    shown = (DOC.parent / picture[1]).resolve().relative_to(ROOT)  # the link is relative to docs/
    return shlex.split(block[1])[1:], block[2], str(shown)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plan_example_prints_what_the_doc_shows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, shown, picture = _example()
    assert "--plot" in argv and argv[argv.index("--plot") + 1] == picture
    drawn = tmp_path / "plan.png"
    argv[argv.index("--plot") + 1] = str(drawn)  # never overwrite the committed picture
    monkeypatch.chdir(ROOT)  # the command's paths are relative to the repository
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    assert out == shown
    committed = (ROOT / picture).read_bytes()
    # Same picture geometry (bytes can differ between matplotlib/freetype builds).
    assert _png_size(drawn.read_bytes()) == _png_size(committed)
