"""Download one snapshot of a hub repository into a directory, safely and once.

- **Once.** A marker file (``.kvgate-model.json``) written last says the directory holds a
  complete download of this repository, revision and exclusion list; a restarted init container
  (or another pod on a shared claim) finds it and skips the download without asking the hub.
- **Never someone else's directory.** A directory whose marker names another repository,
  revision or exclusion list, or that holds files and no marker, is refused: weights another
  revision's engines may be reading are never overwritten.
- **One writer.** An exclusive ``flock`` on ``.kvgate-model.lock`` makes pods sharing a claim
  wait for the one downloading (where the filesystem has no locks, each writes its own partial
  files, named after its pod).
- **Atomic, resumable files.** Each file is streamed into ``.kvgate-partial/`` and renamed into
  place only once its size and SHA-256 (when the hub gives one: LFS files) match; a cut transfer
  resumes with a ``Range`` request on the next try.
- **Retries.** No answer, a 5xx, a 429 (after its ``Retry-After``) or a cut or corrupt transfer
  is retried with exponential back-off; 401, 403 and 404 are not, and say what to fix.
- **Bounded.** At most ``concurrency`` files at once, 1 MiB chunks; one snapshot (every file by
  the commit the revision resolved to), even if the branch moves meanwhile.
- **The token** goes to the endpoint's own origin only (not to a CDN a redirect points at) and
  is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from yarl import URL

from kvgate.modelfetch.hub import (
    MAX_INFO_BYTES,
    HubError,
    RepoFile,
    RetryableHubError,
    Snapshot,
    TokenSource,
    file_url,
    info_url,
    parse_snapshot,
    same_origin,
    status_error,
)

MARKER = ".kvgate-model.json"
LOCK = ".kvgate-model.lock"
PARTIAL_DIR = ".kvgate-partial"
CHUNK = 2**20
MAX_REDIRECTS = 5
MAX_RETRY_AFTER = 60.0
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MIB = 2**20
GIB = 2**30
# What an empty destination may hold: kvgate's own lock, a marker being written, and what a
# fresh filesystem (ext4's lost+found) or a NAS (NetApp's .snapshot) puts at a volume's root.
_NOT_CONTENT = frozenset({LOCK, f"{MARKER}.tmp", "lost+found", ".snapshot"})
# A pod's check that it may write (a file of its own name: pods sharing a claim check at once).
PROBE_PREFIX = f"{LOCK}.probe-"

Log = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True)
class FetchOptions:
    """One download: what, from where, into where, and how hard to try."""

    endpoint: str
    repo: str
    revision: str
    dest: Path
    token: str | None = None
    token_source: TokenSource = field(default_factory=TokenSource)
    exclude: tuple[str, ...] = ()
    concurrency: int = 4
    attempts: int = 6
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    connect_timeout: float = 30.0
    read_timeout: float = 60.0
    lock_poll: float = 2.0
    identity: str = field(default_factory=socket.gethostname)  # partial files' owner


@dataclass(frozen=True)
class FetchResult:
    """What a run did: skipped (the marker said complete) or downloaded."""

    skipped: bool
    commit: str
    files: int
    files_downloaded: int
    bytes_total: int
    bytes_downloaded: int
    seconds: float

    def describe(self) -> str:
        if self.skipped:
            return (
                f"already complete ({self.files} files, {self.bytes_total / GIB:,.2f} GiB at "
                f"commit {self.commit}); nothing downloaded"
            )
        rate = self.bytes_downloaded / MIB / self.seconds if self.seconds > 0 else 0.0
        return (
            f"downloaded {self.files_downloaded} of {self.files} files, "
            f"{self.bytes_downloaded / GIB:,.2f} GiB in {self.seconds:,.1f} s "
            f"({rate:,.1f} MiB/s) at commit {self.commit}"
        )


class DestinationInUse(HubError):
    """The destination holds something this download must not overwrite."""


# ---------------------------------------------------------------- the marker
def _marker_identity(options: FetchOptions) -> dict[str, Any]:
    return {"repo": options.repo, "revision": options.revision, "exclude": list(options.exclude)}


def read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((dest / MARKER).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as someone else's
    return doc if isinstance(doc, dict) else {}


def _write_marker(dest: Path, doc: Mapping[str, Any]) -> None:
    tmp = dest / f"{MARKER}.tmp"
    with tmp.open("w") as out:
        json.dump(doc, out, indent=2, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(dest / MARKER)
    _fsync_dir(dest)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _marker_files(marker: Mapping[str, Any]) -> list[RepoFile]:
    files = []
    for entry in marker.get("files") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get("path"), str):
            size = entry.get("size")
            sha = entry.get("sha256")
            files.append(
                RepoFile(
                    entry["path"],
                    size if isinstance(size, int) else None,
                    sha if isinstance(sha, str) else None,
                )
            )
    return files


def _complete_on_disk(dest: Path, files: list[RepoFile]) -> bool:
    """Every file of a completed marker is still there, at its size (a cheap check: each was
    verified before it was renamed into place)."""
    for f in files:
        try:
            size = (dest / f.path).stat().st_size
        except OSError:
            return False
        if f.size is not None and size != f.size:
            return False
    return bool(files)


def _check_destination(dest: Path, marker: dict[str, Any] | None, options: FetchOptions) -> None:
    """Refuse a destination this download would overwrite someone else's files in."""
    if marker is None:
        others = sorted(
            p.name
            for p in dest.iterdir()
            if p.name not in _NOT_CONTENT and not p.name.startswith(PROBE_PREFIX)
        )
        if others:
            raise DestinationInUse(
                f"{dest} already holds {len(others)} entries kvgate did not download "
                f"(e.g. {others[0]!r}) and no {MARKER}; refusing to write into it: point "
                "spec.model.path at an empty or new directory"
            )
        return
    mine = _marker_identity(options)
    theirs = {key: marker.get(key) for key in mine}
    if theirs != mine:
        raise DestinationInUse(
            f"{dest} holds a download of {marker.get('repo')!r} at revision "
            f"{marker.get('revision')!r} (exclude {marker.get('exclude')}) according to "
            f"{MARKER}, not {options.repo!r} at {options.revision!r} (exclude "
            f"{list(options.exclude)}); engines of another revision may be reading it, so it is "
            "not overwritten: use another spec.model.path for this one"
        )


# ---------------------------------------------------------------- the lock
@contextlib.asynccontextmanager
async def _exclusive(dest: Path, options: FetchOptions, log: Log) -> AsyncIterator[None]:
    """Hold ``flock(LOCK)`` (waiting for another pod's download to finish), or go on unlocked
    where the filesystem has no locks."""
    fd = os.open(dest / LOCK, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        waiting_since: float | None = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    log(f"another download into {dest} is running (its lock is held); waiting")
                await asyncio.sleep(options.lock_poll)
            except OSError as error:
                if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    log(f"{dest} does not support file locks; downloading without one")
                    break
                raise
        if waiting_since is not None:
            log(f"the other download ended after {time.monotonic() - waiting_since:,.0f} s")
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------- HTTP
class _Hub:
    """GETs against the endpoint: the token on its own origin only, redirects followed by hand
    (at most MAX_REDIRECTS, http and https only)."""

    def __init__(self, session: aiohttp.ClientSession, options: FetchOptions) -> None:
        self.session = session
        self.options = options

    def headers(self, url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity", "User-Agent": "kvgate-fetch-model/1"}
        if self.options.token and same_origin(url, self.options.endpoint):
            headers["Authorization"] = f"Bearer {self.options.token}"
        return {**headers, **(extra or {})}

    @contextlib.asynccontextmanager
    async def get(
        self, url: str, what: str, extra: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                response = await self.session.get(
                    current, headers=self.headers(current, extra), allow_redirects=False
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                raise RetryableHubError(
                    f"no answer from {URL(current).origin()} for {what} ({type(error).__name__})"
                ) from None
            if response.status not in REDIRECTS:
                try:
                    yield response
                finally:
                    response.release()
                return
            location = response.headers.get("Location", "")
            response.release()
            try:
                target = URL(current).join(URL(location))
            except ValueError:
                target = URL()
            if not location or target.scheme not in ("http", "https") or not target.host:
                raise HubError(f"the hub redirected {what} to an unusable location")
            current = str(target)
        raise HubError(f"the hub redirected {what} more than {MAX_REDIRECTS} times")


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    raw = response.headers.get("Retry-After", "")
    try:
        return min(max(float(raw), 0.0), MAX_RETRY_AFTER)
    except ValueError:
        return None


def _error_for(
    response: aiohttp.ClientResponse, options: FetchOptions, path: str | None, revision: str
) -> HubError:
    error = status_error(
        response.status,
        response.headers.get("X-Error-Code"),
        repo=options.repo,
        revision=revision,
        endpoint=options.endpoint,
        token=options.token_source,
        path=path,
    )
    if isinstance(error, RetryableHubError):
        error.retry_after = _retry_after(response)
    return error


async def _with_retries(
    what: str, options: FetchOptions, log: Log, attempt: Callable[[], Awaitable[T]]
) -> T:
    """Run ``attempt`` until it returns, retrying RetryableHubError with jittered exponential
    back-off (a Retry-After is honoured, up to MAX_RETRY_AFTER s)."""
    for number in range(1, options.attempts + 1):
        try:
            return await attempt()
        except RetryableHubError as error:
            if number == options.attempts:
                raise HubError(f"{error}; gave up after {options.attempts} tries") from None
            delay = min(options.backoff_max, options.backoff_initial * 2 ** (number - 1))
            delay *= random.uniform(0.5, 1.0)
            if error.retry_after is not None:
                delay = max(delay, error.retry_after)
            log(f"{what}: {error}; try {number + 1} of {options.attempts} in {delay:.1f} s")
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------- the download
class _Download:
    """The files of one snapshot into ``options.dest``."""

    def __init__(self, hub: _Hub, options: FetchOptions, log: Log) -> None:
        self.hub, self.options, self.log = hub, options, log
        self.dest = options.dest
        self.commit = options.revision
        self.bytes_downloaded = 0
        self.files_downloaded = 0

    async def snapshot(self, revision: str) -> Snapshot:
        """The listing of ``revision`` (the spec's, or the commit a resumed download began)."""
        options = self.options
        url = info_url(options.endpoint, options.repo, revision)
        what = f"the file list of {options.repo} at revision {revision}"

        async def once() -> Snapshot:
            async with self.hub.get(url, what) as response:
                if response.status != 200:
                    raise _error_for(response, options, None, revision)
                try:
                    body = await response.content.read(MAX_INFO_BYTES + 1)
                except (aiohttp.ClientError, TimeoutError, OSError) as error:
                    raise RetryableHubError(
                        f"{what} was cut off ({type(error).__name__})"
                    ) from None
            return parse_snapshot(body, options.repo, revision, options.exclude)

        return await _with_retries(what, options, self.log, once)

    def partial_path(self, f: RepoFile) -> Path:
        key = hashlib.sha256(f"{self.commit}\0{f.path}".encode()).hexdigest()[:32]
        return self.dest / PARTIAL_DIR / f"{key}.{self.owner}.part"

    @property
    def owner(self) -> str:
        """This pod's name as it appears in its partial files' names."""
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in self.options.identity)[:64]

    def in_place(self, f: RepoFile) -> bool:
        """Already there: a file is renamed into place only after it was verified."""
        try:
            size = (self.dest / f.path).stat().st_size
        except OSError:
            return False
        return f.size is None or size == f.size

    async def file(self, f: RepoFile, slots: asyncio.Semaphore) -> None:
        async with slots:
            started = time.monotonic()
            brought = await _with_retries(
                repr(f.path), self.options, self.log, lambda: self._transfer(f)
            )
            self.files_downloaded += 1
            self.bytes_downloaded += brought
            took = time.monotonic() - started
            if f.sha256 is not None:
                checked = "size and SHA-256 checked"
            elif f.size is not None:
                checked = "size checked"
            else:
                checked = "the hub listed no size to check"
            self.log(f"{f.path}: {brought / MIB:,.1f} MiB in {took:,.1f} s ({checked})")

    async def _transfer(self, f: RepoFile) -> int:
        """One try at one file, resuming this pod's partial file; the bytes it brought."""
        part = self.partial_path(f)
        part.parent.mkdir(parents=True, exist_ok=True)
        offset = part.stat().st_size if part.exists() else 0
        if f.size is not None and offset > f.size:
            part.unlink()
            offset = 0
        hasher = hashlib.sha256()
        if offset:
            await asyncio.to_thread(_hash_file, part, hasher)
        brought = 0
        if f.size is None or offset < f.size:
            brought, offset, hasher = await self._stream(f, part, offset, hasher)
        elif not part.exists():
            part.touch()  # an empty file
        if f.size is not None and offset != f.size:
            raise RetryableHubError(
                f"{f.path!r} was cut short at {offset:,} of {f.size:,} bytes (resumed next try)"
            )
        if f.sha256 is not None and hasher.hexdigest() != f.sha256:
            part.unlink(missing_ok=True)
            raise RetryableHubError(
                f"{f.path!r} has SHA-256 {hasher.hexdigest()}, not the hub's {f.sha256}: "
                "corrupted in transit or on the hub (downloaded again)"
            )
        final = self.dest / f.path
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, final)
        _fsync_dir(final.parent)
        return brought

    async def _stream(
        self, f: RepoFile, part: Path, offset: int, hasher: Any
    ) -> tuple[int, int, Any]:
        """GET the file from ``offset`` into ``part``: (bytes brought, bytes in part, hasher)."""
        options = self.options
        url = file_url(options.endpoint, options.repo, self.commit, f.path)
        extra = {"Range": f"bytes={offset}-"} if offset else None
        brought = 0
        async with self.hub.get(url, repr(f.path), extra) as response:
            if response.status == 416 and offset:
                part.unlink(missing_ok=True)
                raise RetryableHubError(f"{f.path!r}: the hub refused to resume; starting over")
            if response.status == 200 and offset:
                offset, hasher = 0, hashlib.sha256()  # the whole file came: start over
            elif response.status not in (200, 206):
                raise _error_for(response, options, f.path, self.commit)
            with part.open("ab" if offset else "wb") as out:
                try:
                    async for chunk in response.content.iter_chunked(CHUNK):
                        if f.size is not None and offset + len(chunk) > f.size:
                            raise _TooLong()
                        out.write(chunk)
                        hasher.update(chunk)
                        offset += len(chunk)
                        brought += len(chunk)
                except _TooLong:
                    out.close()
                    part.unlink(missing_ok=True)
                    raise RetryableHubError(
                        f"{f.path!r}: the hub sent more than the {f.size:,} bytes it listed "
                        "(downloaded again)"
                    ) from None
                except (aiohttp.ClientError, TimeoutError, OSError) as error:
                    raise RetryableHubError(
                        f"{f.path!r} was cut off at {offset:,} bytes ({type(error).__name__}; "
                        "resumed next try)"
                    ) from None
                out.flush()
                os.fsync(out.fileno())
        return brought, offset, hasher

    def clean_partials(self) -> None:
        """This pod's partial files, and the folder once empty."""
        folder = self.dest / PARTIAL_DIR
        for leftover in folder.glob(f"*.{self.owner}.part"):
            leftover.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


class _TooLong(Exception):
    """The hub sent more bytes than it listed."""


def _hash_file(path: Path, hasher: Any) -> None:
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            hasher.update(chunk)


def _marker(options: FetchOptions, snapshot: Snapshot, state: str) -> dict[str, Any]:
    return {
        **_marker_identity(options),
        "writer": "kvgate fetch-model",
        "state": state,
        "endpoint": options.endpoint,
        "commit": snapshot.commit,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in snapshot.files],
        "bytes": snapshot.total_bytes,
        **({"completedAt": datetime.now(UTC).isoformat()} if state == "complete" else {}),
    }


def _prepare(dest: Path) -> None:
    try:
        dest.mkdir(parents=True, exist_ok=True)
        probe = (
            dest
            / f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}-{random.getrandbits(32):08x}"
        )
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise HubError(
            f"cannot write into {dest} ({error.strerror or type(error).__name__}): the download "
            "volume must be writable by the pod's user (uid 1000, fsGroup 1000); for a "
            "persistentVolumeClaim, by a storage class that honours fsGroup"
        ) from None


async def fetch_model(options: FetchOptions, log: Log) -> FetchResult:
    """Put the snapshot of ``options.repo`` at ``options.revision`` into ``options.dest``
    (skipped when its marker says it is there). HubError when it cannot."""
    started = time.monotonic()
    dest = options.dest
    await asyncio.to_thread(_prepare, dest)
    async with _exclusive(dest, options, log):
        marker = read_marker(dest)
        _check_destination(dest, marker, options)
        resume_commit: str | None = None
        if marker is not None:
            files = _marker_files(marker)
            commit = str(marker.get("commit") or options.revision)
            if marker.get("state") == "complete" and _complete_on_disk(dest, files):
                return FetchResult(
                    skipped=True,
                    commit=commit,
                    files=len(files),
                    files_downloaded=0,
                    bytes_total=sum(f.size or 0 for f in files),
                    bytes_downloaded=0,
                    seconds=time.monotonic() - started,
                )
            resume_commit = commit
            log(f"resuming the download of {options.repo} at commit {commit} into {dest}")
        timeout = aiohttp.ClientTimeout(
            total=None, connect=options.connect_timeout, sock_read=options.read_timeout
        )
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            download = _Download(_Hub(session, options), options, log)
            # A resumed download lists the commit it began with: one snapshot, however the
            # branch moved since.
            snapshot = await download.snapshot(resume_commit or options.revision)
            snapshot = Snapshot(options.repo, options.revision, snapshot.commit, snapshot.files)
            download.commit = snapshot.commit
            await asyncio.to_thread(_write_marker, dest, _marker(options, snapshot, "downloading"))
            todo = [f for f in snapshot.files if not download.in_place(f)]
            log(
                f"{options.repo} at {options.revision} (commit {snapshot.commit}): "
                f"{len(snapshot.files)} files, {snapshot.total_bytes / GIB:,.2f} GiB; "
                f"{len(todo)} to download into {dest}, {options.concurrency} at a time"
            )
            slots = asyncio.Semaphore(options.concurrency)
            transfers = [asyncio.ensure_future(download.file(f, slots)) for f in todo]
            try:
                await asyncio.gather(*transfers)
            except BaseException:
                for transfer in transfers:
                    transfer.cancel()
                await asyncio.gather(*transfers, return_exceptions=True)
                raise
        download.clean_partials()
        await asyncio.to_thread(_write_marker, dest, _marker(options, snapshot, "complete"))
        return FetchResult(
            skipped=False,
            commit=snapshot.commit,
            files=len(snapshot.files),
            files_downloaded=download.files_downloaded,
            bytes_total=snapshot.total_bytes,
            bytes_downloaded=download.bytes_downloaded,
            seconds=time.monotonic() - started,
        )
