"""kvgate_engine.flag_reader: an argument list read the way argparse (allow_abbrev=True) reads it,
for a set of flags of interest."""

from __future__ import annotations

import argparse

import pytest
from kvgate_engine.flag_reader import FlagUse, last_uses, named_flags, read_flags

FLAGS = ("--context-length", "--kv-cache-dtype", "--kv-canary", "--enable-dp-attention")
SWITCHES = ("--enable-dp-attention",)


def _use(
    index: int, written: str, flags: tuple[str, ...], value: str | None, explicit: bool = False
) -> FlagUse:
    return FlagUse(index, written, flags, value, explicit)


# (args, what the reader finds)
READ: list[tuple[list[str], list[FlagUse]]] = [
    (["--context-length", "8"], [_use(0, "--context-length", ("--context-length",), "8")]),
    (["--context-length=8"], [_use(0, "--context-length", ("--context-length",), "8", True)]),
    (["--context-len", "8"], [_use(0, "--context-len", ("--context-length",), "8")]),
    (["--context-len=8=9"], [_use(0, "--context-len", ("--context-length",), "8=9", True)]),
    (["--kv-cache-d=x"], [_use(0, "--kv-cache-d", ("--kv-cache-dtype",), "x", True)]),
    (["--kv-ca", "x"], [_use(0, "--kv-ca", ("--kv-cache-dtype", "--kv-canary"), "x")]),
    (["--log-level", "info", "--kv-can", "log"], [_use(2, "--kv-can", ("--kv-canary",), "log")]),
    (["--enable-dp-attention", "x"], [_use(0, "--enable-dp-attention", FLAGS[3:], None)]),
    (["--enable-dp", "x"], [_use(0, "--enable-dp", FLAGS[3:], None)]),
    # the value of a flag is never an option
    (
        ["--context-length", "--kv-canary", "log"],
        [
            _use(0, "--context-length", ("--context-length",), None),
            _use(1, "--kv-canary", ("--kv-canary",), "log"),
        ],
    ),
    (["--context-length"], [_use(0, "--context-length", ("--context-length",), None)]),
    # a negative number is a value
    (["--context-length", "-1"], [_use(0, "--context-length", ("--context-length",), "-1")]),
    # "--" ends the options: nothing after it is a flag
    (["--", "--context-length", "8"], []),
    (["--log-level", "info", "--", "--kv-canary"], []),
    # one item with a space and no "=" is a positional to argparse
    (["--context-length 8"], []),
    # not flags of interest
    (["--log-level", "--context-lengths", "--contexts", "context-length", "-c", "--=8"], []),
    # a value that looks like a flag of interest is still read as the flag when it is one item
    (
        ["--served-model-name", "--kv-canary=none"],
        [_use(1, "--kv-canary", ("--kv-canary",), "none", True)],
    ),
]


@pytest.mark.parametrize(("args", "expected"), READ, ids=[" ".join(a) or "-" for a, _ in READ])
def test_read_flags_finds_what_argparse_would_read_as_a_flag_of_interest(
    args: list[str], expected: list[FlagUse]
) -> None:
    assert read_flags(args, FLAGS, SWITCHES) == expected


def test_a_use_says_how_it_was_written() -> None:
    exact, abbreviated, ambiguous = read_flags(
        ["--kv-canary", "log", "--context-len", "8", "--kv-ca", "x"], FLAGS
    )
    assert (exact.flag, exact.abbreviated, exact.ambiguous) == ("--kv-canary", False, False)
    assert (abbreviated.flag, abbreviated.abbreviated) == ("--context-length", True)
    assert (ambiguous.flag, ambiguous.ambiguous) == ("--kv-cache-dtype", True)


def test_an_exact_flag_of_interest_wins_over_a_longer_one_it_is_a_prefix_of() -> None:
    assert named_flags("--model=x", ("--model-path", "--model")) == ("--model",)
    assert named_flags("--mode", ("--model-path", "--model")) == ("--model-path", "--model")


def test_last_uses_keeps_the_last_value_and_drops_an_ambiguous_prefix() -> None:
    args = ["--context-length", "8", "--kv-ca", "x", "--context-len=16"]
    found = last_uses(args, FLAGS, SWITCHES)
    assert list(found) == ["--context-length"]
    assert found["--context-length"].value == "16"


def _argparse() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--context-length")
    parser.add_argument("--kv-cache-dtype")
    parser.add_argument("--kv-canary")
    parser.add_argument("--enable-dp-attention", action="store_true")
    parser.add_argument("--log-level")
    return parser


@pytest.mark.parametrize(
    "args",
    [
        ["--context-len", "8"],
        ["--context-length=8", "--context-length", "16"],
        ["--kv-cache-d=fp8", "--log-level", "info", "--kv-can", "log"],
        ["--enable-dp", "--context-length=-1"],
        ["--log-level=--context-length"],
    ],
)
def test_last_uses_agree_with_argparse_itself(args: list[str]) -> None:
    parsed = vars(_argparse().parse_args(args))
    found = last_uses(args, FLAGS, SWITCHES)
    for flag in FLAGS:
        dest = flag.removeprefix("--").replace("-", "_")
        if flag in SWITCHES:
            assert (flag in found) == parsed[dest]
        else:
            assert (found[flag].value if flag in found else None) == parsed[dest]
