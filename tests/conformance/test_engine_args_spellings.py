"""Conformance: kvgate reads ``spec.engine.args`` the way each supported SGLang release does.

kvgate appends ``engine.args`` after its own flags; SGLang's parser (argparse,
``prepare_server_args``) accepts any unique prefix of a flag and ``--flag=value``, and keeps the
last value. Admission denies the flags kvgate sets itself or cannot verify
(``kvgate.admission.engine_args.DENIED_ENGINE_FLAGS``) and the estimator reads the flags that
change how the pool is sized (``kvgate_engine.estimator.SIZING_FLAGS``), both through one reader,
``kvgate_engine.flag_reader``, which takes any prefix of a flag of interest as that flag. Here each
release's own parser (``ServerArgs.add_cli_args``, as ``prepare_server_args`` builds it) says what
every spelling means, for every option string and every prefix of it (``--x``, ``--xy``, ...),
alone and with ``=value``, in one subprocess per release (in its own environment,
tests/conformance/setup_env.sh; its answer cached by everything it depends on,
factories/release_answers.py), and for each table:

- every spelling the release reads as a table flag is read by kvgate as that flag (so every
  spelling of a denied flag is denied);
- no option string of the release outside the table is read by kvgate as a table flag (the only
  way the prefix rule could catch an allowed flag is one whose exact spelling is a strict prefix
  of a table flag);
- every table flag is an option of a supported release, with all of its aliases, and takes a
  value exactly when the table says so;
- the parser reads the way the reader assumes (abbreviations on, no ``@file`` arguments, no
  positional arguments, no ``REMAINDER`` option).

And every flag kvgate's launcher passes with a value is denied in ``engine.args``; those it passes
without one are store_true flags with no way to turn them off.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories.release_answers import ask_release
from kvgate.admission.engine_args import (
    DENIED_ENGINE_FLAGS,
    DENIED_SWITCHES,
    KVGATE_SWITCHES,
    SGLANG_ALIASES,
    denied_uses,
)
from kvgate_engine.estimator import SIZING_FLAGS, SIZING_SWITCHES
from kvgate_engine.flag_reader import FlagUse, read_flags
from kvgate_engine.launcher import EngineLaunch, engine_argv
from test_sglang_argv import SUPPORTED_VERSIONS, sglang_envs

pytestmark = pytest.mark.conformance

__all__ = ["sglang_envs"]  # the module fixture this file uses

# Runs inside one SGLang environment: the parser prepare_server_args builds, its actions, and
# what it makes of every prefix of every option string (argparse's own _parse_optional: an
# ambiguous prefix makes it exit, reported as "ambiguous").
PARSER = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
actions = parser._actions
index = {id(action): i for i, action in enumerate(actions)}


def resolve(spelling):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = parser._parse_optional(spelling)
    except SystemExit:
        return "ambiguous"
    if not parsed:
        return None
    found = parsed if isinstance(parsed, list) else [parsed]  # a list from Python 3.12 on
    if len(found) != 1 or found[0][0] is None:
        return None
    return index[id(found[0][0])]


spellings = {}
for option in list(parser._option_string_actions):
    if not option.startswith("--"):
        continue
    for end in range(3, len(option) + 1):
        for spelling in (option[:end], option[:end] + "=1"):
            if spelling not in spellings:
                spellings[spelling] = resolve(spelling)
print("KVGATE-RESULTS " + json.dumps({
    "allow_abbrev": parser.allow_abbrev,
    "fromfile_prefix_chars": parser.fromfile_prefix_chars,
    "prefix_chars": parser.prefix_chars,
    "actions": [
        {
            "options": action.option_strings,
            "dest": action.dest,
            "nargs": action.nargs,
            "store_true": isinstance(action, argparse._StoreTrueAction),
            "kind": type(action).__name__,
        }
        for action in actions
    ],
    "spellings": spellings,
}))
"""


@dataclass(frozen=True)
class Action:
    options: tuple[str, ...]
    dest: str
    nargs: int | str | None
    store_true: bool
    kind: str


@dataclass(frozen=True)
class Release:
    """What one release's parser says."""

    version: str
    allow_abbrev: bool
    fromfile_prefix_chars: str | None
    prefix_chars: str
    actions: tuple[Action, ...]
    spellings: Mapping[str, int | str | None]  # spelling -> action index, "ambiguous" or None

    @property
    def options(self) -> dict[str, Action]:
        return {option: action for action in self.actions for option in action.options}


@dataclass(frozen=True)
class Table:
    """A set of flags kvgate reads engine.args for, and how it reads them."""

    flags: Mapping[str, object]  # option string -> what it stands for (equal for aliases)
    switches: Collection[str]
    read: Callable[[Sequence[str]], list[FlagUse]]
    alias_of: Callable[[str], str]  # an option string -> the flag it is another name of


TABLES = {
    "denied in engine.args": Table(
        DENIED_ENGINE_FLAGS,
        DENIED_SWITCHES,
        denied_uses,
        lambda option: SGLANG_ALIASES.get(option, option),
    ),
    "the estimator's sizing flags": Table(
        SIZING_FLAGS,
        SIZING_SWITCHES,
        lambda args: read_flags(args, SIZING_FLAGS, SIZING_SWITCHES),
        SIZING_FLAGS.__getitem__,
    ),
}


def _release(version: str, target: Path) -> Release:
    raw: dict[str, Any] = ask_release(target, PARSER)
    return Release(
        version=version,
        allow_abbrev=raw["allow_abbrev"],
        fromfile_prefix_chars=raw["fromfile_prefix_chars"],
        prefix_chars=raw["prefix_chars"],
        actions=tuple(
            Action(tuple(a["options"]), a["dest"], a["nargs"], a["store_true"], a["kind"])
            for a in raw["actions"]
        ),
        spellings=raw["spellings"],
    )


@pytest.fixture(scope="module")
def releases(sglang_envs: dict[str, Path]) -> dict[str, Release]:
    """Each release's parser, asked once (one subprocess per release, side by side: most of
    each one's time is importing SGLang and torch), or its cached answer."""
    with ThreadPoolExecutor(len(SUPPORTED_VERSIONS)) as pool:
        asked = {
            version: pool.submit(_release, version, sglang_envs[version])
            for version in SUPPORTED_VERSIONS
        }
        return {version: future.result() for version, future in asked.items()}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_release_parses_the_way_kvgate_reads_it(
    version: str, releases: dict[str, Release]
) -> None:
    release = releases[version]
    assert release.allow_abbrev, "kvgate reads any prefix of a flag as SGLang's argparse does"
    assert release.fromfile_prefix_chars is None  # no @file: every flag is in engine.args
    assert release.prefix_chars == "-"
    # No positional argument: `--` and anything after it make the engine refuse to start, so
    # the reader stops there without missing a flag.
    assert [a.dest for a in release.actions if not a.options] == []
    assert [a.options for a in release.actions if a.nargs == "..."] == []
    assert {o for o in release.options if not o.startswith("--")} == {"-h"}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_spelling_the_release_reads_as_a_table_flag_kvgate_reads_as_that_flag(
    version: str, table: str, releases: dict[str, Release]
) -> None:
    release, reading = releases[version], TABLES[table]
    wrong = []
    checked = read_as_table_flag = 0
    for spelling, resolved in release.spellings.items():
        checked += 1
        if not isinstance(resolved, int):
            continue  # ambiguous (SGLang exits 2) or no option: moot
        action = release.actions[resolved]
        if not set(action.options) & set(reading.flags):
            continue
        read_as_table_flag += 1
        uses = reading.read([spelling, "1"])
        if not uses or uses[0].index != 0 or not set(uses[0].flags) <= set(action.options):
            wrong.append(
                f"SGLang {version} reads {spelling} as {action.options[0]}; kvgate reads it as "
                f"{uses[0].flags if uses and uses[0].index == 0 else 'nothing'}"
            )
    print(
        f"\nSGLang {version} ({table}): {len(release.options)} option strings, {checked} "
        f"spellings checked, {read_as_table_flag} read as a table flag"
    )
    assert read_as_table_flag > 10
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_no_other_option_of_the_release_is_read_as_a_table_flag(
    version: str, table: str, releases: dict[str, Release]
) -> None:
    release, reading = releases[version], TABLES[table]
    wrong = []
    others = 0
    for option, action in release.options.items():
        if set(action.options) & set(reading.flags):
            continue
        others += 1
        for written in ([option, "1"], [f"{option}=1"]):
            uses = reading.read(written)
            if uses:
                wrong.append(
                    f"SGLang {version}'s {option} ({action.dest}) is read by kvgate as "
                    f"{uses[0].flags}: its spelling is a strict prefix of a table flag"
                )
    # Abbreviations of an allowed flag that are also a prefix of a table flag the release lacks
    # are caught too (moot once the release has it: argparse finds them ambiguous).
    caught = sorted(
        spelling
        for spelling, resolved in release.spellings.items()
        if isinstance(resolved, int)
        and not set(release.actions[resolved].options) & set(reading.flags)
        and reading.read([spelling])
    )
    print(
        f"\nSGLang {version} ({table}): {others} option strings outside the table, none read "
        f"as a table flag; abbreviations of them read as one: {len(caught)} {caught[:8]}"
    )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("table", TABLES)
def test_every_table_flag_is_an_option_of_a_release_with_all_its_aliases(
    table: str, releases: dict[str, Release]
) -> None:
    reading = TABLES[table]
    wrong = []
    seen: set[str] = set()
    for version, release in releases.items():
        options = release.options
        seen |= set(reading.flags) & set(options)
        for action in release.actions:
            mine = set(action.options) & set(reading.flags)
            if not mine:
                continue
            missing = set(action.options) - set(reading.flags)
            if missing:
                wrong.append(f"SGLang {version}: {sorted(mine)} without its alias {missing}")
            if len({repr(reading.flags[o]) for o in mine}) != 1:
                wrong.append(f"SGLang {version}: the aliases {sorted(mine)} read differently")
            for option in mine:
                if reading.alias_of(option) != action.options[0]:
                    wrong.append(
                        f"SGLang {version}: {option} is another name of {action.options[0]}, "
                        f"kvgate's table says of {reading.alias_of(option)}"
                    )
            for option in mine:
                if (option in reading.switches) != (action.nargs == 0):
                    wrong.append(
                        f"SGLang {version}: {option} takes {'no' if action.nargs == 0 else 'a'}"
                        f" value (nargs {action.nargs!r}), kvgate's table says otherwise"
                    )
    unknown = sorted(set(reading.flags) - seen)
    assert not unknown, f"not an option of any supported SGLang release: {unknown}"
    assert not wrong, "\n".join(wrong)


def _launches(version: str) -> list[EngineLaunch]:
    """Every flag kvgate's launcher can pass for this release: both roles, every option on."""
    common: dict[str, Any] = {
        "image": f"lmsysorg/sglang:v{version}",
        "model_path": "/models/m",
        "served_model_name": "m",
        "port": 30000,
        "context_length": 4096,
        "mem_fraction_static": 0.8,
        "tensor_parallel": 2,
        "page_size": 16,
        "kv_cache_dtype": "auto",
        "transfer_backend": "mooncake",
        "bootstrap_port": 8998,
        "ib_devices": ("mlx5_0",),
        "api_key_from_env": True,
        "max_total_tokens": 8192,
        "kv_checksum": True,
        "kv_canary": True,
        "nnodes": 2,
        "node_rank": "1",
        "dist_init_addr": "leader:5000",
    }
    return [EngineLaunch(role=role, **common) for role in ("prefill", "decode")]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_flag_kvgate_passes_is_denied_in_engine_args_or_a_switch_it_cannot_undo(
    version: str, releases: dict[str, Release]
) -> None:
    release = releases[version]
    options = release.options
    wrong = []
    passed = {a for launch in _launches(version) for a in engine_argv(launch)[3:]}
    for flag in sorted(a for a in passed if a.startswith("--")):
        action = options[flag]
        if action.nargs == 0:
            same_dest = [a.options for a in release.actions if a.dest == action.dest]
            if flag not in KVGATE_SWITCHES or not action.store_true or len(same_dest) != 1:
                wrong.append(
                    f"{flag} ({action.kind}, dest {action.dest} set by {same_dest}): a switch "
                    "kvgate passes must be a store_true flag nothing else can turn off, listed "
                    "in KVGATE_SWITCHES"
                )
        elif flag not in DENIED_ENGINE_FLAGS:
            wrong.append(f"kvgate passes {flag} with a value, but engine.args may override it")
    assert not wrong, "\n".join(wrong)
