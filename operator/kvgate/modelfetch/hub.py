"""The Hugging Face Hub HTTP API as `kvgate fetch-model` speaks it (pure: URLs, answers, errors).

Two requests, as ``huggingface_hub``'s ``snapshot_download`` makes them:

- ``GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true``: the commit the revision
  resolves to (``sha``) and its files (``siblings``: ``rfilename``, ``size``, and for LFS files
  ``lfs.sha256`` and ``lfs.size``);
- ``GET {endpoint}/{repo}/resolve/{commit}/{file}``: one file, often a redirect to a CDN on
  another host for LFS files. Asking by commit keeps every file of one download from one
  snapshot even if the branch moves meanwhile.

The hub, or whatever answers at the endpoint, is not trusted: the listing is capped, every file
name must be a plain relative path (no ``..``, no absolute path, nothing kvgate writes itself),
and messages never quote a body or a header beyond the hub's short error code.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

MAX_INFO_BYTES = 16 * 2**20  # a listing of ~80,000 files; real repositories list tens
MAX_FILES = 10_000
MAX_NAME_LENGTH = 1024
# Names kvgate writes into the destination itself; a repository may not hold them.
RESERVED_PREFIX = ".kvgate-"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
ERROR_CODE = re.compile(r"^[A-Za-z]{1,64}$")


class HubError(Exception):
    """The download cannot go on; ``str()`` says why, with the repository, the revision, the
    Secret the token came from and the way out. It never holds the token."""


class RetryableHubError(HubError):
    """Worth another try: no answer, a 5xx, a 429, a cut or corrupt transfer."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class TokenSource:
    """Where the token came from, for messages (never the token itself)."""

    secret_name: str | None = None
    secret_key: str | None = None
    sent: bool = False

    def describe(self) -> str:
        if not self.sent:
            if self.secret_name:
                return (
                    f"no token was sent (Secret {self.secret_name} key {self.secret_key} gave "
                    "an empty value)"
                )
            return "no token was sent (spec.model.source.download.tokenSecretRef is not set)"
        if self.secret_name:
            return f"the token from Secret {self.secret_name} key {self.secret_key}"
        return "the token given"


@dataclass(frozen=True)
class RepoFile:
    """One file of a snapshot: its path in the repository, its size and, for LFS files, its
    SHA-256 (the hub gives no SHA-256 of a small file: only its git blob id)."""

    path: str
    size: int | None
    sha256: str | None


@dataclass(frozen=True)
class Snapshot:
    """What a revision of a repository holds: the commit it resolved to and its files."""

    repo: str
    revision: str
    commit: str
    files: tuple[RepoFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)


def info_url(endpoint: str, repo: str, revision: str) -> str:
    return (
        f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"
    )


def file_url(endpoint: str, repo: str, commit: str, path: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo}/resolve/{quote(commit, safe='')}/{quote(path)}"


def safe_name_problem(name: object) -> str | None:
    """Why a file name from the hub cannot be written under the destination, or None."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if len(name) > MAX_NAME_LENGTH:
        return f"longer than {MAX_NAME_LENGTH} characters"
    if "\x00" in name or "\\" in name:
        return "holds a NUL or a backslash"
    if name.startswith("/"):
        return "is absolute"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "holds an empty, '.' or '..' segment"
    if posixpath.normpath(name) != name:
        return "is not a plain relative path"
    if any(part.startswith(RESERVED_PREFIX) for part in parts):
        return f"starts with {RESERVED_PREFIX}, which kvgate keeps for itself"
    return None


def _size(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def excluded(path: str, patterns: Sequence[str]) -> bool:
    """``huggingface_hub``'s ignore_patterns rule: fnmatch, where ``*`` also matches ``/``; a
    pattern ending in ``/`` means everything under that folder."""
    return any(
        fnmatch.fnmatchcase(path, pattern + "*" if pattern.endswith("/") else pattern)
        for pattern in patterns
    )


def parse_snapshot(body: bytes, repo: str, revision: str, exclude: Sequence[str] = ()) -> Snapshot:
    """The listing answer as a Snapshot; HubError naming what is wrong with it."""
    where = f"the hub's listing of {repo} at revision {revision}"
    if len(body) > MAX_INFO_BYTES:
        raise HubError(f"{where} is larger than {MAX_INFO_BYTES // 2**20} MiB; refused")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise HubError(f"{where} is not JSON; is the endpoint a Hugging Face Hub?") from None
    if not isinstance(doc, Mapping):
        raise HubError(f"{where} is not a JSON object; is the endpoint a Hugging Face Hub?")
    siblings = doc.get("siblings")
    if not isinstance(siblings, list):
        raise HubError(f"{where} has no file list (siblings); is the endpoint a Hugging Face Hub?")
    if len(siblings) > MAX_FILES:
        raise HubError(f"{where} lists {len(siblings):,} files, more than {MAX_FILES:,}; refused")
    commit = doc.get("sha")
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        commit = revision  # an older or simpler hub: ask for the files by the revision itself
    files: list[RepoFile] = []
    seen: set[str] = set()
    for entry in siblings:
        name = entry.get("rfilename") if isinstance(entry, Mapping) else None
        problem = safe_name_problem(name)
        if problem is not None:
            shown = name[:80] if isinstance(name, str) else type(name).__name__
            raise HubError(f"{where} names a file {shown!r} that {problem}; refused")
        assert isinstance(name, str)
        if name in seen or excluded(name, exclude):
            continue
        seen.add(name)
        lfs = entry.get("lfs")
        sha256 = lfs.get("sha256") if isinstance(lfs, Mapping) else None
        size = _size(lfs.get("size")) if isinstance(lfs, Mapping) else None
        if size is None:
            size = _size(entry.get("size"))
        files.append(
            RepoFile(
                path=name,
                size=size,
                sha256=sha256 if isinstance(sha256, str) and SHA256.fullmatch(sha256) else None,
            )
        )
    if not files:
        raise HubError(
            f"{where} lists no file to download"
            + (f" once {list(exclude)} are excluded" if exclude else "")
        )
    # A file and a folder of the same name cannot both be written.
    folders = {posixpath.dirname(f.path) for f in files}
    clash = sorted(f.path for f in files if f.path in folders)
    if clash:
        raise HubError(f"{where} lists {clash[0]!r} as both a file and a folder; refused")
    return Snapshot(repo=repo, revision=revision, commit=commit, files=tuple(files))


def status_error(
    status: int,
    error_code: str | None,
    *,
    repo: str,
    revision: str,
    endpoint: str,
    token: TokenSource,
    path: str | None = None,
) -> HubError:
    """What an HTTP status from the hub means for this download, and what to do."""
    code = error_code if error_code and ERROR_CODE.fullmatch(error_code) else None
    what = f"{path!r} of {repo}" if path else f"repository {repo}"
    shown_code = f" ({code})" if code else ""
    answered = f"{endpoint} answered {status}{shown_code} for {what} at revision {revision}"
    field = "spec.model.source.download"
    if status == 401:
        return HubError(
            f"{answered}: the repository does not exist, or it is private or gated and "
            f"{token.describe()} is not accepted; check {field}.repo, and that the Secret "
            "holds a valid hub token (with read access)"
        )
    if status == 403:
        return HubError(
            f"{answered}: {token.describe()} may not read it (a gated model whose terms the "
            "token's account has not accepted, or a token without read access); accept the "
            "model's terms on the hub with that account, or put a token with read access in "
            "the Secret"
        )
    if status == 404:
        if code == "RevisionNotFound" or (path is None and code != "RepoNotFound"):
            return HubError(
                f"{answered}: no such revision or repository; check {field}.revision "
                f"({revision}) and {field}.repo"
            )
        return HubError(f"{answered}: not found; check {field}.repo and {field}.revision")
    if status == 429 or status >= 500:
        return RetryableHubError(f"{answered}: the hub is busy or failing")
    return HubError(f"{answered}: unexpected; check {field}.endpoint ({endpoint})")


def same_origin(a: str, b: str) -> bool:
    """Whether two absolute URLs share scheme, host and port (the token goes only there)."""
    default = {"http": 80, "https": 443}
    try:
        first, second = urlsplit(a), urlsplit(b)
        ports = (first.port or default.get(first.scheme), second.port or default.get(second.scheme))
    except ValueError:  # a port that is no number
        return False
    return (
        first.scheme == second.scheme
        and (first.hostname or "").lower() == (second.hostname or "").lower()
        and ports[0] == ports[1]
    )
