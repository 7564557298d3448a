"""`kvgate fetch-model` against a local hub on 127.0.0.1 that speaks the Hugging Face Hub API
(kvgate_e2e.model_hub): what lands on disk, what the hub sees, and what a user reads when it
fails."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from factories.local_http import serving_app
from kvgate.cmd import cli
from kvgate.modelfetch import download
from kvgate.modelfetch.download import (
    LOCK,
    MARKER,
    PARTIAL_DIR,
    DestinationInUse,
    FetchOptions,
    FetchResult,
    fetch_model,
)
from kvgate.modelfetch.hub import HubError, TokenSource
from kvgate_e2e.model_hub import HubServer, HubState, serving

REPO = "kvgate-test/tiny-model"
TOKEN = "hf_s3cr3t-token-value-never-logged"
SECRET = TokenSource(secret_name="hub-token", secret_key="token", sent=True)
WEIGHTS = bytes(range(256)) * 4096 * 3  # 3 MiB: three 1 MiB chunks
FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 384}).encode(),
    "tokenizer.json": b'{"version": "1.0"}',
    "model.safetensors": WEIGHTS,
    "nested/extra.bin": b"\x00\x01" * 1000,
    "original/consolidated.00.pth": b"x" * 5000,
}


def _repo(root: Path, repo: str = REPO, files: dict[str, bytes] = FILES) -> Path:
    base = root / repo
    for rel, data in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(data)
    return base


@pytest.fixture
def hub_state(tmp_path: Path) -> HubState:
    root = tmp_path / "hub"
    _repo(root)
    return HubState(root=root, token=TOKEN)


@pytest.fixture
def hub(hub_state: HubState) -> Iterator[HubServer]:
    with serving(hub_state) as server:
        yield server


class Log(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)

    def text(self) -> str:
        return "\n".join(self)


def options(url: str, dest: Path, **changes: object) -> FetchOptions:
    base: dict[str, object] = {
        "endpoint": url,
        "repo": REPO,
        "revision": "main",
        "dest": dest,
        "token": TOKEN,
        "token_source": SECRET,
        "backoff_initial": 0.01,
        "backoff_max": 0.05,
        "identity": "pod-a",
    }
    return FetchOptions(**{**base, **changes})  # type: ignore[arg-type]


def fetch(opts: FetchOptions, log: Log | None = None) -> FetchResult:
    return asyncio.run(fetch_model(opts, log if log is not None else Log()))


def assert_same_files(dest: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel


def test_a_snapshot_lands_verified_with_a_marker_and_a_rate(hub: HubServer, tmp_path: Path) -> None:
    dest = tmp_path / "models" / "tiny"
    log = Log()
    result = fetch(options(hub.url, dest), log)
    assert_same_files(dest, FILES)
    assert not result.skipped and result.files == result.files_downloaded == len(FILES)
    assert result.bytes_downloaded == sum(len(d) for d in FILES.values())
    marker = json.loads((dest / MARKER).read_text())
    assert marker["state"] == "complete" and marker["repo"] == REPO
    assert len(marker["commit"]) == 40
    weights = next(f for f in marker["files"] if f["path"] == "model.safetensors")
    assert weights == {
        "path": "model.safetensors",
        "size": len(WEIGHTS),
        "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
    }
    assert not (dest / PARTIAL_DIR).exists()
    assert "MiB/s" in result.describe() and "model.safetensors: 3.0 MiB" in log.text()
    assert "(size and SHA-256 checked)" in log.text()


def test_every_file_is_asked_for_by_the_commit_the_revision_resolved_to(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    result = fetch(options(hub.url, tmp_path / "m"))
    resolves = [s.path for s in hub_state.seen if "/resolve/" in s.path]
    assert resolves and all(f"/resolve/{result.commit}/" in p for p in resolves), resolves
    (info,) = [s.path for s in hub_state.seen if s.path.startswith("/api/")]
    assert info == f"/api/models/{REPO}/revision/main"


def test_a_restart_finds_the_marker_and_asks_the_hub_nothing(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    dest = tmp_path / "m"
    first = fetch(options(hub.url, dest))
    asked = len(hub_state.seen)
    again = fetch(options(hub.url, dest))
    assert again.skipped and again.commit == first.commit and again.files == len(FILES)
    assert len(hub_state.seen) == asked
    assert "nothing downloaded" in again.describe()


def test_a_file_missing_after_completion_is_fetched_again_from_the_same_commit(
    hub: HubServer, tmp_path: Path
) -> None:
    dest = tmp_path / "m"
    first = fetch(options(hub.url, dest))
    (dest / "tokenizer.json").unlink()
    again = fetch(options(hub.url, dest))
    assert not again.skipped and again.files_downloaded == 1 and again.commit == first.commit
    assert_same_files(dest, FILES)


def test_the_token_goes_to_the_hub_but_never_to_the_cdn_a_redirect_names(
    hub_state: HubState, tmp_path: Path
) -> None:
    cdn_state = HubState(root=hub_state.root)  # another origin: a CDN needs no token
    with serving(cdn_state) as cdn:
        hub_state.cdn_base = cdn.url
        with serving(hub_state) as hub:
            fetch(options(hub.url, tmp_path / "m"))
    assert hub_state.seen and all(s.authorized for s in hub_state.seen)
    cdn_paths = [s.path for s in cdn_state.seen]
    assert len(cdn_paths) == 3, cdn_paths  # the three LFS files (.safetensors, .bin, .pth)
    assert not any(s.sent_token for s in cdn_state.seen)
    assert_same_files(tmp_path / "m", FILES)


def test_a_missing_token_and_a_wrong_one_are_told_apart_and_the_token_is_never_shown(
    hub: HubServer, tmp_path: Path
) -> None:
    log = Log()
    with pytest.raises(HubError) as none:
        fetch(options(hub.url, tmp_path / "a", token=None, token_source=TokenSource()), log)
    message = str(none.value)
    assert f"answered 401 (RepoNotFound) for repository {REPO} at revision main" in message
    assert "no token was sent (spec.model.source.download.tokenSecretRef is not set)" in message

    wrong = "hf_wrong-token-also-secret"
    with pytest.raises(HubError) as bad:
        fetch(options(hub.url, tmp_path / "b", token=wrong), log)
    message = str(bad.value)
    assert "the token from Secret hub-token key token is not accepted" in message
    assert "check spec.model.source.download.repo" in message
    for text in (str(none.value), message, log.text()):
        assert TOKEN not in text and wrong not in text


def test_an_unknown_revision_names_the_field(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(HubError) as error:
        fetch(options(hub.url, tmp_path / "m", revision="v9"))
    assert "404 (RevisionNotFound)" in str(error.value)
    assert "check spec.model.source.download.revision (v9)" in str(error.value)


def test_a_busy_hub_is_retried_with_back_off(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    hub_state.fail_first[f"/api/models/{REPO}/revision/main"] = 2
    log = Log()
    fetch(options(hub.url, tmp_path / "m"), log)
    assert "try 2 of 6" in log.text() and "try 3 of 6" in log.text()
    assert_same_files(tmp_path / "m", FILES)


def test_a_hub_that_stays_busy_gives_up_after_the_attempts(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    hub_state.fail_first[f"/api/models/{REPO}/revision/main"] = 100
    with pytest.raises(HubError) as error:
        fetch(options(hub.url, tmp_path / "m", attempts=3))
    assert "503" in str(error.value) and "gave up after 3 tries" in str(error.value)


def test_a_cut_transfer_resumes_where_it_stopped(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    hub_state.cut_after["model.safetensors"] = 1_500_000
    log = Log()
    fetch(options(hub.url, tmp_path / "m"), log)
    (resumed,) = [s.range for s in hub_state.seen if s.path.startswith("/cdn/") and s.range]
    assert resumed is not None
    offset = int(resumed.removeprefix("bytes=").removesuffix("-"))  # what had arrived
    assert 0 < offset <= 1_500_000, resumed
    assert "resumed next try" in log.text()
    assert_same_files(tmp_path / "m", FILES)


def test_corrupt_bytes_fail_the_sha256_and_are_downloaded_again(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    hub_state.corrupt.add("model.safetensors")
    log = Log()
    fetch(options(hub.url, tmp_path / "m"), log)
    assert f"not the hub's {hashlib.sha256(WEIGHTS).hexdigest()}" in log.text()
    assert_same_files(tmp_path / "m", FILES)


def test_excluded_patterns_are_not_downloaded(hub: HubServer, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    result = fetch(options(hub.url, dest, exclude=("original/*", "*.bin")))
    assert result.files == 3
    assert not (dest / "original").exists() and not (dest / "nested").exists()
    # The same directory with another exclusion list is another download: refused.
    with pytest.raises(DestinationInUse):
        fetch(options(hub.url, dest))


def test_a_directory_holding_another_download_is_never_overwritten(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    _repo(hub_state.root, "kvgate-test/other", {"config.json": b"{}"})
    dest = tmp_path / "m"
    fetch(options(hub.url, dest))
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    with pytest.raises(DestinationInUse) as error:
        fetch(options(hub.url, dest, repo="kvgate-test/other"))
    assert f"holds a download of '{REPO}' at revision 'main'" in str(error.value)
    assert "use another spec.model.path" in str(error.value)
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before


def test_a_directory_with_files_kvgate_did_not_download_is_refused(
    hub: HubServer, tmp_path: Path
) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "weights.safetensors").write_bytes(b"someone else's")
    with pytest.raises(DestinationInUse) as error:
        fetch(options(hub.url, dest))
    assert "1 entries kvgate did not download" in str(error.value)
    assert (dest / "weights.safetensors").read_bytes() == b"someone else's"


def test_pods_sharing_a_claim_download_once(
    hub: HubServer, hub_state: HubState, tmp_path: Path
) -> None:
    dest = tmp_path / "shared"

    async def both() -> list[FetchResult]:
        return list(
            await asyncio.gather(
                fetch_model(options(hub.url, dest, identity="pod-a", lock_poll=0.01), Log()),
                fetch_model(options(hub.url, dest, identity="pod-b", lock_poll=0.01), Log()),
            )
        )

    results = asyncio.run(both())
    assert sorted(r.skipped for r in results) == [False, True]
    info = [s for s in hub_state.seen if s.path.startswith("/api/")]
    assert len(info) == 1
    assert_same_files(dest, FILES)
    assert (dest / LOCK).exists()


async def test_a_listing_with_a_path_outside_the_destination_is_refused(tmp_path: Path) -> None:
    async def listing(request: web.Request) -> web.Response:
        return web.json_response(
            {"sha": "a" * 40, "siblings": [{"rfilename": "../../etc/cron.d/x", "size": 1}]}
        )

    app = web.Application()
    app.router.add_get("/api/models/{ns}/{name}/revision/{rev}", listing)
    async with serving_app(app) as url:
        with pytest.raises(HubError) as error:
            await fetch_model(options(url, tmp_path / "m"), Log())
    assert "names a file '../../etc/cron.d/x' that holds an empty, '.' or '..' segment" in str(
        error.value
    )
    assert not (tmp_path / "etc").exists()


async def test_at_most_concurrency_files_are_in_flight(tmp_path: Path) -> None:
    in_flight = 0
    most = 0
    names = [f"shard-{i}.txt" for i in range(8)]

    async def listing(request: web.Request) -> web.Response:
        siblings = [{"rfilename": n, "size": 5} for n in names]
        return web.json_response({"sha": "b" * 40, "siblings": siblings})

    async def resolve(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return web.Response(body=b"12345")

    app = web.Application()
    app.router.add_get("/api/models/{ns}/{name}/revision/{rev}", listing)
    app.router.add_get("/{ns}/{name}/resolve/{rev}/{file}", resolve)
    async with serving_app(app) as url:
        result = await fetch_model(options(url, tmp_path / "m", concurrency=2), Log())
    assert result.files_downloaded == 8 and most == 2


async def test_a_hub_that_sends_more_than_it_listed_is_cut_off(tmp_path: Path) -> None:
    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"sha": "c" * 40, "siblings": [{"rfilename": "a", "size": 4}]})

    async def resolve(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 10_000)

    app = web.Application()
    app.router.add_get("/api/models/{ns}/{name}/revision/{rev}", listing)
    app.router.add_get("/{ns}/{name}/resolve/{rev}/{file}", resolve)
    async with serving_app(app) as url:
        with pytest.raises(HubError) as error:
            await fetch_model(options(url, tmp_path / "m", attempts=2), Log())
    assert "sent more than the 4 bytes it listed" in str(error.value)
    assert not (tmp_path / "m" / "a").exists()


def test_the_cli_exits_0_then_1_naming_the_secret_and_never_prints_the_token(
    hub: HubServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["fetch-model", "--repo", REPO, "--endpoint", hub.url, "--dest", str(tmp_path / "m")]
    argv += ["--token-secret-name", "hub-token", "--token-secret-key", "token"]
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(argv) == 0
    monkeypatch.setenv("HF_TOKEN", "hf_not-the-right-one")
    argv[argv.index(str(tmp_path / "m"))] = str(tmp_path / "n")
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "with a token" in err and "downloaded 5 of 5 files" in err
    assert "kvgate fetch-model: " in err and "Secret hub-token key token" in err
    assert TOKEN not in err and "hf_not-the-right-one" not in err


def test_the_cli_reads_the_endpoint_from_hf_endpoint(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(["fetch-model", "--repo", REPO, "--dest", str(tmp_path / "m")]) == 0
    assert_same_files(tmp_path / "m", FILES)


def test_an_unwritable_destination_says_what_the_volume_needs(
    hub: HubServer, tmp_path: Path
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(HubError) as error:
        fetch(options(hub.url, locked / "m"))
    assert "writable by the pod's user (uid 1000, fsGroup 1000)" in str(error.value)


def test_pods_checking_a_shared_claim_at_once_all_find_it_writable(tmp_path: Path) -> None:
    # Each pod checks with a file of its own: with one shared name, one pod's unlink removed the
    # file another had just created and that pod's download failed "cannot write into".
    dest = tmp_path / "shared"
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        checks = [pool.submit(download._prepare, dest) for _ in range(400)]
        errors = [c.exception() for c in checks if c.exception() is not None]
    assert errors == []
    assert list(dest.iterdir()) == []


def test_another_pods_write_check_is_not_taken_for_foreign_files(tmp_path: Path) -> None:
    (tmp_path / f"{download.PROBE_PREFIX}pod-b-1-0badcafe").touch()
    download._check_destination(tmp_path, None, options("http://127.0.0.1:1", tmp_path))
