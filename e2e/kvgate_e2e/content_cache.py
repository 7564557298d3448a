"""Content-keyed disk caches: a result kept under the SHA-256 of everything it depends on.

A caller names what its result depends on (``key_inputs``, any JSON value) and how to compute it;
the key is the SHA-256 of those inputs in a canonical form. Two kinds of entry, in a directory of
the caller's:

- an *answer*, a JSON value: ``<key>.json`` holds the key, the inputs, the answer and the answer's
  SHA-256, written atomically (a temporary file, then ``os.replace``);
- a *directory* of files: ``<key>/`` holds them and ``CACHE_ENTRY``, which names the key, the
  inputs and every file's SHA-256; it is built in a temporary directory beside it, then renamed.

An entry that does not parse, names another key or whose checksums do not match is recomputed,
never trusted. A miss is computed holding ``<key>.lock`` (``fcntl.flock``), so two pytest-xdist
workers (or threads) asking the same question compute it once: the second waits, then reads the
first one's entry. A directory entry is read holding that lock shared, so it is never replaced
while it is being read. A computation that raises stores nothing. ``fresh=True`` (each cache has
its variable for it) computes afresh and stores the new result.

Users: the conformance tier's release answers (``tests/factories/release_answers.py``) and the
real-engine scenarios' tiny Llama and known answer (``kvgate_e2e.real_engine_cache``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# The file in a directory entry that names its key, its inputs and its files' checksums.
CACHE_ENTRY = ".kvgate-cache-entry.json"


def cache_home() -> Path:
    """``${KVGATE_CACHE:-~/.cache/kvgate}``: every cache of kvgate's tests lives below it."""
    return Path(os.environ.get("KVGATE_CACHE") or Path.home() / ".cache" / "kvgate")


def asked_afresh(variable: str) -> bool:
    """Does the environment variable ``variable`` ask for fresh results (set, not empty or 0)?"""
    return os.environ.get(variable, "") not in ("", "0")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(value: Any) -> bytes:
    """For keys: the same inputs give the same bytes whatever their order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def dump(value: Any) -> bytes:
    """For answers: kept in the order they were computed in."""
    return json.dumps(value, separators=(",", ":")).encode()


def cache_key(key_inputs: Any) -> str:
    return sha256(canonical(key_inputs))


def file_digests(directory: Path) -> dict[str, str]:
    """The SHA-256 of every file below ``directory`` by its relative path (``CACHE_ENTRY`` at
    the top left out)."""
    return {
        path.relative_to(directory).as_posix(): sha256(path.read_bytes())
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path != directory / CACHE_ENTRY
    }


@dataclass(frozen=True)
class Found(Generic[T]):
    """A cached result: its value, its key, and whether this call computed it."""

    value: T
    key: str
    computed: bool


def write_atomically(path: Path, data: bytes, scratch: Path | None = None) -> None:
    """``path`` holds ``data`` or what it held before, never a part of it. The temporary file is
    written in ``scratch`` (same file system; default: beside ``path``)."""
    fd, temporary = tempfile.mkstemp(
        dir=path.parent if scratch is None else scratch, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextmanager
def locked(
    path: Path,
    deadline_s: float,
    on_wait: Callable[[], None] | None = None,
    *,
    shared: bool = False,
) -> Iterator[None]:
    """Hold a ``flock`` on ``path`` (exclusive, or ``shared``); if another holds it in a way
    that excludes this one, call ``on_wait`` once and wait, failing after ``deadline_s``."""
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            deadline = time.monotonic() + deadline_s
            pause = 0.01
            while True:
                try:
                    fcntl.flock(lock, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"{path} held for over {deadline_s:.0f} s by another worker"
                        ) from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.25)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_answer(path: Path, key: str) -> tuple[bool, Any]:
    """(True, answer) for an intact entry of ``key``; (False, None) for a missing or corrupt one."""
    try:
        entry = json.loads(path.read_bytes())
        answer = entry["answer"]
        intact = entry["key"] == key and entry["answer_sha256"] == sha256(dump(answer))
    except (OSError, ValueError, KeyError, TypeError):
        return False, None
    return (True, answer) if intact else (False, None)


def cached_answer(
    directory: Path,
    key_inputs: Mapping[str, Any],
    compute: Callable[[], Any],
    *,
    deadline_s: float,
    fresh: bool = False,
    on_wait: Callable[[], None] | None = None,
) -> Found[Any]:
    """The answer stored in ``directory`` under ``key_inputs``, or ``compute()``'s (a JSON
    value), stored then. A hit and a miss give the same value: the answer as read back from its
    JSON. ``fresh`` computes (without waiting for the lock: the write is atomic) and stores."""
    directory.mkdir(parents=True, exist_ok=True)
    key = cache_key(key_inputs)
    path = directory / f"{key}.json"

    def compute_and_store() -> Found[Any]:
        answer = json.loads(dump(compute()))
        entry = {
            "key": key,
            "answer_sha256": sha256(dump(answer)),
            "asked": key_inputs,
            "answer": answer,
        }
        write_atomically(path, dump(entry))
        return Found(answer, key, computed=True)

    if fresh:
        return compute_and_store()
    hit, answer = _read_answer(path, key)
    if hit:
        return Found(answer, key, computed=False)
    with locked(directory / f"{key}.lock", deadline_s, on_wait):
        hit, answer = _read_answer(path, key)  # another worker may have stored it meanwhile
        return Found(answer, key, computed=False) if hit else compute_and_store()


def _intact_directory(path: Path, key: str) -> bool:
    try:
        entry = json.loads((path / CACHE_ENTRY).read_bytes())
        return bool(entry["key"] == key and entry["files"] == file_digests(path))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def cached_directory(
    directory: Path,
    key_inputs: Mapping[str, Any],
    build: Callable[[Path], None],
    use: Callable[[Path], T],
    *,
    deadline_s: float,
    fresh: bool = False,
    on_wait: Callable[[], None] | None = None,
) -> Found[T]:
    """``use(entry)`` of the directory entry in ``directory`` under ``key_inputs``, built first
    by ``build(empty directory)`` when there is none intact (or ``fresh``). ``use`` runs holding
    the entry's lock, so nothing replaces the entry while it reads it; it must not keep the path
    (copy what it needs: the entry belongs to the cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = cache_key(key_inputs)
    path = directory / key
    lock = directory / f"{key}.lock"

    if not fresh:
        with locked(lock, deadline_s, on_wait, shared=True):
            if _intact_directory(path, key):
                return Found(use(path), key, computed=False)
    with locked(lock, deadline_s, on_wait):
        if not fresh and _intact_directory(path, key):  # built by another worker meanwhile
            return Found(use(path), key, computed=False)
        built = Path(tempfile.mkdtemp(dir=directory, prefix=f".{key}.", suffix=".tmp"))
        try:
            build(built)
            entry = {"key": key, "asked": key_inputs, "files": file_digests(built)}
            (built / CACHE_ENTRY).write_bytes(dump(entry))
            if path.exists() or path.is_symlink():  # a corrupt entry, or a fresh one asked for
                stale = directory / f".{key}.{os.getpid()}.{time.monotonic_ns()}.stale"
                path.rename(stale)
                _remove(stale)
            built.rename(path)
        except BaseException:
            _remove(built)
            raise
        return Found(use(path), key, computed=True)
