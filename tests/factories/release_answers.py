"""What an SGLang release's own code answers, asked in a subprocess and cached on disk by everything
the answer depends on.

The conformance tier runs a probe script with the project's Python and one release's environment
(tests/conformance/setup_env.sh) on its path; the probe prints ``KVGATE-RESULTS <json>``. That JSON
changes only when the release environment, the interpreter, the probe or its input changes, so
``ask_release`` keeps it in ``${KVGATE_CACHE:-~/.cache/kvgate}/conformance/answers/<key>.json``,
the key a SHA-256 over all of them (``release_inputs``, ``interpreter_inputs``, the script, the
exact stdin text, ``read_inputs`` of the files the probe reads outside the environment, the
source of ``run_probe``, which runs it). Only the
release's answer is cached: every comparison with kvgate's tables and builders runs every time.

- A miss runs the probe and writes the entry atomically (a temporary file, then ``os.replace``),
  holding ``<key>.lock`` (``fcntl.flock``) so that two pytest-xdist workers asking the same
  question compute it once: the second waits, then reads the first one's entry.
- An entry holds its key and the SHA-256 of its answer; one that does not parse or match is
  recomputed, never trusted. A probe that prints no answer fails the test and nothing is stored.
- ``KVGATE_CONFORMANCE_NO_CACHE=1`` asks every release afresh (and stores the fresh answers).

The cache's mechanics (the key, the lock, the checksummed entries) are
``kvgate_e2e.content_cache``'s, shared with the real-engine scenarios' caches; what an environment
and its interpreter contribute to a key is ``kvgate_e2e.sglang_inputs``'.

Not in the key: facts of the machine other than ``HOST_READS`` (its memory, its CPUs). The
probes report the parser's options and choices and the values of flags the argv sets, which do
not depend on them, and the cache is the machine's own. An answer is one run's: where a release
builds a flag's choices from a set (``--sampling-backend``), their order differs from run to run
and the entry keeps one; the tests compare such choices as sets.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kvgate_e2e import content_cache
from kvgate_e2e.content_cache import asked_afresh, cache_home, sha256, write_atomically
from kvgate_e2e.sglang_inputs import installed_records, interpreter_inputs, sglang_versions

CONFORMANCE_CACHE = cache_home() / "conformance"
ANSWERS = CONFORMANCE_CACHE / "answers"
NO_CACHE = "KVGATE_CONFORMANCE_NO_CACHE"
RESULTS_PREFIX = "KVGATE-RESULTS "

# How the probe runs: offline, no GPU (the same for every release).
PROBE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
# What the machine tells a probe that SGLang reads: prepare_server_args checks
# --disaggregation-ib-device against the InfiniBand devices here (validation_hook.py).
HOST_READS = (Path("/sys/class/infiniband"),)
# The probe's subprocess times out after PROBE_TIMEOUT s, so a worker holding a key's lock longer
# than LOCK_DEADLINE is stuck: the waiting one fails instead of hanging.
PROBE_TIMEOUT = 600.0
LOCK_DEADLINE = PROBE_TIMEOUT + 300.0


def release_inputs(target: Path) -> dict[str, Any]:
    """What a release environment contributes to an answer.

    - the SGLang version, from its ``sglang-<version>.dist-info``;
    - the bytes of ``sglang/srt/server_args*.py`` and ``sglang/srt/arg_groups/**/*.py``, where the
      releases declare their options (``ServerArgs.add_cli_args`` and, from 0.5.20 on, the
      ``arg_groups`` fields and resolution hooks ``prepare_server_args`` runs): an edit there in
      place changes the key;
    - every ``*.dist-info/RECORD`` in the environment (``installed_records``: the rest of SGLang
      that ``sglang.srt.server_args`` imports, transformers, pydantic, ...), without reading the
      environment's ~4,700 SGLang files on every run;
    - the names at the environment's top (setup_env.sh's stamp, which names its own hash).
    """
    srt = target / "sglang" / "srt"
    sources = sorted(
        [*srt.glob("server_args*.py"), *(srt / "arg_groups").rglob("*.py")],
        key=lambda p: p.relative_to(target).as_posix(),
    )
    return {
        "sglang": sglang_versions(target),
        "option_sources": {
            p.relative_to(target).as_posix(): sha256(p.read_bytes()) for p in sources
        },
        "installed": installed_records(target),
        "top": sorted(p.name for p in target.iterdir()),
    }


def read_inputs(paths: Iterable[Path]) -> dict[str, Any]:
    """What the probe reads outside the environment: a file's SHA-256, a directory's entries, or
    None for a path that does not exist."""
    found: dict[str, Any] = {}
    for path in paths:
        if path.is_dir():
            found[str(path)] = sorted(os.listdir(path))
        elif path.exists():
            found[str(path)] = sha256(path.read_bytes())
        else:
            found[str(path)] = None
    return found


def cached_answer(
    key_inputs: Mapping[str, Any],
    compute: Callable[[], Any],
    *,
    answers: Path | None = None,
    deadline_s: float = LOCK_DEADLINE,
    on_wait: Callable[[], None] | None = None,
) -> Any:
    """The answer stored under ``key_inputs``, or ``compute()``'s (a JSON value), stored then.

    A hit and a miss return the same thing: the answer as read back from its JSON. With
    ``KVGATE_CONFORMANCE_NO_CACHE=1`` every call computes (without the lock) and stores."""
    return content_cache.cached_answer(
        ANSWERS if answers is None else answers,
        key_inputs,
        compute,
        deadline_s=deadline_s,
        fresh=asked_afresh(NO_CACHE),
        on_wait=on_wait,
    ).value


def run_probe(target: Path, script: str, stdin_text: str | None, env: Mapping[str, str]) -> Any:
    """Run ``script`` with this Python, ``target`` first on its path, in a new empty directory;
    the JSON it printed after ``KVGATE-RESULTS ``."""
    with tempfile.TemporaryDirectory(prefix="kvgate-probe-") as cwd:
        result = subprocess.run(
            [sys.executable, "-c", script],
            input="" if stdin_text is None else stdin_text,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            cwd=cwd,
            env=dict(env),
        )
    lines = [line for line in result.stdout.splitlines() if line.startswith(RESULTS_PREFIX)]
    assert lines, f"SGLang probe did not run (exit {result.returncode}):\n{result.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix(RESULTS_PREFIX))


def ask_release(
    target: Path,
    script: str,
    stdin: Any = None,
    *,
    reads: Iterable[Path] = (),
    answers: Path | None = None,
) -> Any:
    """Run ``script`` with the project's Python and the release installed at ``target`` on its
    path (offline, no GPU), feeding it ``stdin`` as JSON; the JSON it printed after
    ``KVGATE-RESULTS ``, from the cache when the same question was asked of the same release.

    ``reads``: the paths outside the environment the answer depends on (the model's config.json,
    a sysfs directory); their contents are part of the key. The working directory is always a new
    empty one, so it is not."""
    env = {**os.environ, "PYTHONPATH": str(target), **PROBE_ENV}
    stdin_text = None if stdin is None else json.dumps(stdin)
    key_inputs = {
        "runner": inspect.getsource(run_probe),  # how the probe runs (its flags, its stdin)
        "release": release_inputs(target),
        "interpreter": interpreter_inputs(env, sys.executable),
        "script": script,
        "stdin": stdin_text,
        "reads": read_inputs([*HOST_READS, *reads]),
    }
    return cached_answer(
        key_inputs, lambda: run_probe(target, script, stdin_text, env), answers=answers
    )


def model_directory(config: Mapping[str, Any], root: Path | None = None) -> Path:
    """A directory holding only ``config.json`` = ``config``, at a path named by its content, so
    an argv naming it is the same on every run (and its answer cached) while a different config
    gets another path. Rewritten (atomically) when its content is not ``config``'s."""
    text = json.dumps(config, indent=2, sort_keys=True).encode()
    directory = (CONFORMANCE_CACHE / "models" if root is None else root) / sha256(text)[:16]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    try:
        current = path.read_bytes()
    except OSError:
        current = None
    if current != text:
        # Written beside the directory, not in it: a probe running meanwhile sees only config.json.
        write_atomically(path, text, scratch=directory.parent)
    return directory
