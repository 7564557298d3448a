"""Which flags of interest an argument list sets, read the way argparse reads it. Pure.

SGLang (``sglang/srt/server_args.py`` ``prepare_server_args``) and smg parse their command lines
with argparse at its defaults (``allow_abbrev=True``, no ``fromfile_prefix_chars``), so an item:

- that does not start with ``--`` is a value (or a positional), never a flag;
- ``--`` ends the options: nothing after it is read as a flag (neither program takes a
  positional argument, so both refuse to start when one follows);
- ``--flag=value`` names its flag by the part before the first ``=``; the rest is the value;
- names a flag by its exact spelling, or by any prefix of it: argparse reads a prefix that fits one
  flag as that flag, and refuses to start on one that fits several. This reader knows only the
  flags it is asked about, so it reads a prefix of one of them as that flag whatever else the
  program has: right when argparse resolves it the same way, moot when argparse finds it
  ambiguous. It is wrong only for an exact option of the program that is a strict prefix of a flag
  of interest; tests/conformance/test_engine_args_spellings.py shows that no supported SGLang
  release has one (for each table kvgate reads), and tests/admission/test_inputs.py the same for
  smg;
- a flag's value is the next item, unless given with ``=`` or the flag takes none (a switch such
  as a store_true flag); an item that starts with ``--`` is never a value (argparse reads it as an
  option and refuses a flag with its value missing).

An item with a space and no ``=`` (``"--context-length 131072"`` as one item) is a positional to
argparse, so not a flag here either.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

END_OF_OPTIONS = "--"


@dataclass(frozen=True)
class FlagUse:
    """One item of an argument list that names a flag of interest."""

    index: int  # of the item in the list
    written: str  # the item's flag part, before any "="
    flags: tuple[str, ...]  # the flags of interest it names: one, or several it is a prefix of
    value: str | None  # after "=", else the next item; None for a switch or a missing value
    explicit: bool  # the value was given with "="

    @property
    def flag(self) -> str:
        """The flag of interest it is read as (the first, when it is a prefix of several)."""
        return self.flags[0]

    @property
    def abbreviated(self) -> bool:
        """Written as a prefix of the flag rather than the flag itself."""
        return self.written not in self.flags

    @property
    def ambiguous(self) -> bool:
        """A prefix of several flags of interest (argparse refuses it and the program exits)."""
        return len(self.flags) > 1


def spelled_flag(item: str) -> str | None:
    """The flag part of an option item (before any "="), or None for a value or positional."""
    if not item.startswith("--") or item == END_OF_OPTIONS:
        return None
    spelled = item.split("=", 1)[0]
    if spelled == END_OF_OPTIONS:
        return None  # "--=x": no flag is named by an empty name
    return spelled


def named_flags(item: str, flags: Collection[str]) -> tuple[str, ...]:
    """The flags of interest ``item`` names on its own: its exact flag, else every flag of
    interest its flag part is a prefix of (in the order of ``flags``); empty for none."""
    spelled = spelled_flag(item)
    if spelled is None:
        return ()
    if spelled in flags:
        return (spelled,)
    return tuple(flag for flag in flags if flag.startswith(spelled))


def _items(args: Sequence[str]) -> Iterator[tuple[int, str]]:
    for index, item in enumerate(args):
        if item == END_OF_OPTIONS:
            return
        yield index, item


def read_flags(
    args: Sequence[str], flags: Collection[str], switches: Collection[str] = ()
) -> list[FlagUse]:
    """Every item of ``args`` that names a flag of interest, in order (``switches``: the flags of
    interest that take no value)."""
    found = []
    for index, item in _items(args):
        named = named_flags(item, flags)
        if not named:
            continue
        written, equals, after = item.partition("=")
        value: str | None
        if equals:
            value = after
        elif named[0] in switches:
            value = None
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
        else:
            value = None
        found.append(FlagUse(index, written, named, value, bool(equals)))
    return found


def last_uses(
    args: Sequence[str], flags: Collection[str], switches: Collection[str] = ()
) -> dict[str, FlagUse]:
    """flag -> the last item that sets it, as the program reads it (argparse keeps the last
    value); an ambiguous prefix sets nothing (the program would refuse to start)."""
    found: dict[str, FlagUse] = {}
    for use in read_flags(args, flags, switches):
        if not use.ambiguous:
            found[use.flag] = use
    return found
