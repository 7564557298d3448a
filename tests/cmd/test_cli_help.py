"""Every flag says what it does, every one-shot command's --help ends with its exit codes (as
docs/operating.md promises), and ``kubectl kvgate`` offers only the commands a user runs."""

from __future__ import annotations

import argparse

import pytest
from kvgate.cmd.cli import COMMANDS, EXIT_CODES_HELP, ONE_SHOT, PLUGIN_PROG, build_parser, main

SERVER_SIDE = sorted(set(COMMANDS) - ONE_SHOT)


def _subcommands(prog: str = "kvgate") -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(prog)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_flag_of_every_command_has_help() -> None:
    missing = {
        name: [
            action.option_strings or [action.dest] for action in parser._actions if not action.help
        ]
        for name, parser in _subcommands().items()
    }
    assert {name: flags for name, flags in missing.items() if flags} == {}


@pytest.mark.parametrize("command", sorted(ONE_SHOT))
def test_a_one_shot_commands_help_ends_with_its_exit_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--help"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out
    assert out.rstrip().endswith(EXIT_CODES_HELP[command][-1].split("  ", 1)[1][-40:])


def test_the_kubectl_plugin_lists_no_server_side_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(_subcommands(PLUGIN_PROG)) == ONE_SHOT
    assert main(["--help"], prog=PLUGIN_PROG) == 0
    out = capsys.readouterr().out
    for command in SERVER_SIDE:
        assert f"\n    {command} " not in out
    assert main(["operator"], prog=PLUGIN_PROG) == 2  # not a plugin command
    assert "invalid choice: 'operator'" in capsys.readouterr().err
