"""What the real-engine scenarios compute once and keep on disk: the tiny Llama and the greedy
known answer of a unified real server of it.

Both cost minutes of CPU and change only when what they are made from changes, so they are kept in
``${KVGATE_CACHE:-~/.cache/kvgate}/real-engine`` (``kvgate_e2e.content_cache``: content keys,
a per-key flock, checksummed entries, a corrupt one recomputed):

- ``tiny-llama/<key>/``: the model ``make_model_script`` generates, keyed by the script's bytes,
  the seed, the SGLang CPU environment (``environment_inputs``) and the source of the code that
  runs the script. Each caller gets its own copy of the files, so nothing it starts (the engine
  pods read the model from a host path) can change the cache.
- ``known-answers/<key>.json``: a unified server's answer, keyed by the SHA-256 of every file of
  the model, the environment, the server's argv less what differs from run to run (its address
  and the model's path: the model is keyed by content), the request body and the source of the
  code that asks. A failed or empty answer is never stored.

``KVGATE_REAL_ENGINE_NO_CACHE=1`` computes both afresh (and stores them).
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgate_e2e.content_cache import (
    CACHE_ENTRY,
    Found,
    asked_afresh,
    cache_home,
    cached_answer,
    cached_directory,
    file_digests,
    sha256,
)
from kvgate_e2e.real_engine import MAKE_MODEL_SCRIPT, SglangCpu
from kvgate_e2e.sglang_inputs import installed_records, interpreter_inputs, sglang_versions

NO_CACHE = "KVGATE_REAL_ENGINE_NO_CACHE"
MODEL_TIMEOUT = 600.0
# A worker holding a key's lock longer than this is stuck (the model's script times out after
# MODEL_TIMEOUT s, a known answer's server after the scenario's own deadline of 600 s).
LOCK_DEADLINE = 900.0
# Flags of the unified server's argv whose values differ from run to run without changing the
# answer: its address, and the model's path (the model's files are in the key).
RUN_SPECIFIC_FLAGS = ("--host", "--port", "--model-path")
# Files the model script always writes: a directory without them is no model.
MODEL_FILES = ("config.json", "kvgate-tiny-llama.json")


def cache_root() -> Path:
    return cache_home() / "real-engine"


def environment_inputs(env: SglangCpu, python: str) -> dict[str, Any]:
    """What the SGLang CPU environment ``env``, run by ``python``, contributes to a key: its
    SGLang version, pip's RECORD of every distribution in its ``site`` (torch, transformers,
    tokenizers, SGLang, ...), the names at its top (install.sh's stamp names the script's hash)
    and the interpreter with the variables the server and the model script are run with."""
    return {
        "version": env.version,
        "sglang": sglang_versions(env.site),
        "installed": installed_records(env.site),
        "top": sorted(p.name for p in env.root.iterdir()),
        "interpreter": interpreter_inputs({**os.environ, **env.env()}, python),
    }


def _copy_model(source: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(CACHE_ENTRY))
    return out


def _generate(env: SglangCpu, python: str, script: Path, out: Path, seed: int) -> None:
    """Run the model script into ``out``; raise if it failed or wrote no model."""
    subprocess.run(
        [python, str(script), str(out), "--seed", str(seed)],
        env={**os.environ, **env.env()},
        check=True,
        capture_output=True,
        timeout=MODEL_TIMEOUT,
    )
    missing = [name for name in MODEL_FILES if not (out / name).is_file()]
    if missing:
        raise RuntimeError(f"{script} exited 0 but did not write {missing} into {out}")


def tiny_llama(
    env: SglangCpu, python: str, out: Path, seed: int = 0, *, script: Path = MAKE_MODEL_SCRIPT
) -> Found[Path]:
    """The tiny Llama in ``out`` (a copy of the cached one, generated first on a miss)."""
    key_inputs = {
        "script": sha256(script.read_bytes()),
        "seed": seed,
        "environment": environment_inputs(env, python),
        "runner": inspect.getsource(_generate),
    }
    return cached_directory(
        cache_root() / "tiny-llama",
        key_inputs,
        lambda built: _generate(env, python, script, built, seed),
        lambda entry: _copy_model(entry, out),
        deadline_s=LOCK_DEADLINE,
        fresh=asked_afresh(NO_CACHE),
    )


def make_tiny_llama(
    env: SglangCpu, python: str, out: Path, seed: int = 0, *, script: Path = MAKE_MODEL_SCRIPT
) -> Path:
    """The tiny Llama and its tokenizer in ``out`` (kept if already there; else copied from the
    cache, generated first on a miss)."""
    if all((out / name).exists() for name in MODEL_FILES):
        return out
    return tiny_llama(env, python, out, seed, script=script).value


def without_flags(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` less each of ``flags`` and its value (``--flag X`` or ``--flag=X``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not any(arg.startswith(flag + "=") for flag in flags):
            kept.append(arg)
    return kept


def known_answer(
    env: SglangCpu,
    model: Path,
    argv: Sequence[str],
    body: Mapping[str, Any],
    asker: str,
    record: Callable[[], list[int]],
) -> Found[list[int]]:
    """The token ids a unified server started with ``argv`` (on ``model``, in ``env``) answers
    to ``body``: from the cache, or ``record()``'s, stored then. ``asker``: the source of the
    code that starts the server and asks it (``record``'s), part of the key."""

    def recorded() -> list[int]:
        ids = record()
        if not ids or not all(isinstance(i, int) for i in ids):
            raise ValueError(f"the unified server's answer is no token ids: {ids!r}")
        return ids

    key_inputs = {
        "model": file_digests(model),
        "environment": environment_inputs(env, argv[0]),
        "argv": without_flags(argv, RUN_SPECIFIC_FLAGS),
        "body": dict(body),
        "asker": asker,
    }
    found = cached_answer(
        cache_root() / "known-answers",
        key_inputs,
        recorded,
        deadline_s=LOCK_DEADLINE,
        fresh=asked_afresh(NO_CACHE),
    )
    return Found(list(found.value), found.key, found.computed)
