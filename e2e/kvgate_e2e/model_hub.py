"""A local model hub that speaks the part of the Hugging Face Hub HTTP API `kvgate fetch-model`
uses (standard library only), serving model directories from disk.

Nothing here reaches a real hub, so the unit tests (``tests/modelfetch``) and the e2e world (a
pod of the world runs ``python3 -m kvgate_e2e.model_hub``) download from this:

- ``GET /api/models/<repo>/revision/<rev>[?blobs=true]``: ``{"id", "sha", "siblings"}``; with
  ``blobs=true`` each sibling has ``size`` and ``blobId``, and an LFS file (``*.safetensors``,
  ``*.bin``, ``*.pth``, ``*.gguf``, or larger than 10 MiB, as the hub's ``.gitattributes``
  decide) ``lfs: {sha256, size, pointerSize}``. ``<rev>`` is ``main`` or the commit (a SHA-1
  of the files' names and SHA-256s).
- ``GET /<repo>/resolve/<rev>/<path>``: the file, with ``Range`` (206), ``ETag`` and
  ``X-Repo-Commit``. An LFS file is a ``302`` to ``/cdn/<sha256>`` on the CDN origin
  (``cdn_base``: another port stands for another host) as the hub redirects to its CDN.
- Errors as the hub gives them: 401 with ``X-Error-Code: RepoNotFound`` for an unknown repository
  or a missing or wrong token (the hub does not tell them apart), 404 ``RevisionNotFound`` and
  ``EntryNotFound``.

A repository is ``<root>/<namespace>/<name>/`` (its files, folders included). With a token set,
every request but ``/cdn/`` (a signed URL on the real hub) needs ``Authorization: Bearer
<token>``. Faults for the tests are set on ``HubState``: answers of 503 before the real one, a
body cut short after N bytes, corrupt bytes; every request's path, Range and whether it carried
the token are recorded (the token itself is never stored).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".gguf", ".h5", ".msgpack")
LFS_MIN_SIZE = 10 * 2**20
CHUNK = 2**16


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str
    blob_id: str  # git's blob SHA-1
    lfs: bool


@dataclass
class Seen:
    """One request as the hub saw it."""

    path: str
    range: str | None
    authorized: bool  # carried the right token
    sent_token: bool  # carried any Authorization header


@dataclass
class HubState:
    """What the hub serves and the faults it injects (set by tests; thread-safe enough: each
    counter is read and written under ``lock``)."""

    root: Path
    token: str | None = None
    cdn_base: str | None = None  # where LFS files redirect to; None: this server
    fail_first: dict[str, int] = field(default_factory=dict)  # path -> 503s still to answer
    cut_after: dict[str, int] = field(default_factory=dict)  # path -> bytes, then close (once)
    corrupt: set[str] = field(default_factory=set)  # paths served with a flipped byte (once)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def repo_dir(self, repo: str) -> Path | None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?", repo):
            return None
        path = self.root / repo
        return path if path.is_dir() else None

    def files(self, repo_dir: Path) -> list[HubFile]:
        out = []
        for path in sorted(p for p in repo_dir.rglob("*") if p.is_file()):
            data = path.read_bytes()
            rel = path.relative_to(repo_dir).as_posix()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            lfs = rel.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE
            out.append(HubFile(rel, len(data), hashlib.sha256(data).hexdigest(), blob, lfs))
        return out

    def commit(self, files: list[HubFile]) -> str:
        digest = hashlib.sha1()
        for f in files:
            digest.update(f"{f.path}\0{f.sha256}\n".encode())
        return digest.hexdigest()

    def take(self, table: dict[str, int], path: str) -> int | None:
        with self.lock:
            if path not in table:
                return None
            left = table[path]
            if table is self.fail_first:
                if left <= 0:
                    return None
                table[path] = left - 1
                return left
            del table[path]
            return left

    def take_corrupt(self, path: str) -> bool:
        with self.lock:
            if path in self.corrupt:
                self.corrupt.discard(path)
                return True
            return False


def _handler(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(
                status,
                body,
                {
                    "Content-Type": "application/json",
                    "X-Error-Code": code,
                    "X-Error-Message": message,
                },
            )

        def _authorized(self) -> bool:
            header = self.headers.get("Authorization")
            return state.token is None or header == f"Bearer {state.token}"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            header = self.headers.get("Authorization")
            with state.lock:
                state.seen.append(
                    Seen(
                        path,
                        self.headers.get("Range"),
                        authorized=state.token is not None and header == f"Bearer {state.token}",
                        sent_token=header is not None,
                    )
                )
            if state.take(state.fail_first, path):
                self._send(503, b"busy", {"Retry-After": "0"})
                return
            if path.startswith("/cdn/"):
                self._cdn(path.removeprefix("/cdn/"))
                return
            if not self._authorized():
                self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
                return
            info = re.fullmatch(r"/api/models/(.+)/revision/([^/]+)", path)
            if info:
                self._info(info.group(1), info.group(2), parse_qs(url.query))
                return
            resolve = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", path)
            if resolve:
                self._resolve(*resolve.groups())
                return
            self._error(404, "EntryNotFound", "no such endpoint")

        def _repo(self, repo: str, revision: str) -> tuple[Path, list[HubFile], str] | None:
            repo_dir = state.repo_dir(repo)
            if repo_dir is None:
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            files = state.files(repo_dir)
            commit = state.commit(files)
            if revision not in ("main", commit):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            return repo_dir, files, commit

        def _info(self, repo: str, revision: str, query: dict[str, list[str]]) -> None:
            found = self._repo(repo, revision)
            if found is None:
                return
            _, files, commit = found
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings: list[dict[str, Any]] = []
            for f in files:
                entry: dict[str, Any] = {"rfilename": f.path}
                if blobs:
                    entry |= {"size": f.size, "blobId": f.blob_id}
                    if f.lfs:
                        entry["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
                siblings.append(entry)
            doc: dict[str, Any] = {"_id": commit[:24], "id": repo, "modelId": repo, "sha": commit}
            doc["siblings"] = siblings
            self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

        def _resolve(self, repo: str, revision: str, rel: str) -> None:
            found = self._repo(repo, revision)
            if found is None:
                return
            repo_dir, files, commit = found
            entry = next((f for f in files if f.path == rel), None)
            if entry is None:
                self._error(404, "EntryNotFound", f"{rel} does not exist on {revision}")
                return
            headers = {"X-Repo-Commit": commit}
            if entry.lfs:
                base = state.cdn_base or ""
                headers |= {
                    "Location": f"{base}/cdn/{entry.sha256}",
                    "X-Linked-Etag": f'"{entry.sha256}"',
                    "X-Linked-Size": str(entry.size),
                }
                self._send(302, b"", headers)
                return
            self._file(repo_dir / rel, rel, {**headers, "ETag": f'"{entry.blob_id}"'})

        def _cdn(self, sha256: str) -> None:
            for repo_dir in (p for p in state.root.glob("*/*") if p.is_dir()):
                for f in state.files(repo_dir):
                    if f.sha256 == sha256:
                        self._file(repo_dir / f.path, f.path, {"ETag": f'"{sha256}"'})
                        return
            self._send(404, b"no such object")

        def _file(self, path: Path, rel: str, headers: dict[str, str]) -> None:
            data = path.read_bytes()
            if state.take_corrupt(rel) and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start, status = 0, 200
            wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if wanted:
                start = int(wanted.group(1))
                if start >= len(data) and len(data) > 0:
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            cut = state.take(state.cut_after, rel)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            for offset in range(0, len(body), CHUNK):
                self.wfile.write(body[offset : offset + CHUNK])

    return Handler


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, state: HubState) -> None:
        super().__init__((host, port), _handler(state))
        self.state = state

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@contextmanager
def serving(state: HubState, host: str = "127.0.0.1", port: int = 0) -> Iterator[HubServer]:
    """A hub on ``host:port`` (0: a free port) in a background thread, stopped on exit."""
    server = HubServer(host, port, state)
    thread = threading.Thread(target=server.serve_forever, name="model-hub", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a local Hugging Face Hub for the e2e world")
    parser.add_argument("--root", required=True, help="<root>/<namespace>/<name>/ per repository")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--token-file", default=None, help="a file holding the token to require")
    args = parser.parse_args(argv)
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    server = HubServer(args.host, args.port, HubState(Path(args.root), token=token))
    print(f"model hub serving {args.root} at {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
