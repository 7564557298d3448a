"""The hub API as kvgate reads it (pure): URLs, the listing, file names, errors."""

from __future__ import annotations

import json

import pytest
from kvgate.modelfetch.hub import (
    MAX_FILES,
    HubError,
    RetryableHubError,
    TokenSource,
    excluded,
    file_url,
    info_url,
    parse_snapshot,
    safe_name_problem,
    same_origin,
    status_error,
)

SHA = "0123456789abcdef0123456789abcdef01234567"
LFS_SHA = "e" * 64


def listing(*siblings: object, sha: object = SHA) -> bytes:
    return json.dumps({"sha": sha, "siblings": list(siblings)}).encode()


def test_urls_are_the_hubs_with_the_revision_quoted_as_one_segment() -> None:
    assert info_url("https://hf.co/", "org/m", "refs/pr/1") == (
        "https://hf.co/api/models/org/m/revision/refs%2Fpr%2F1?blobs=true"
    )
    assert file_url("https://hf.co", "org/m", SHA, "a b/c.json") == (
        f"https://hf.co/org/m/resolve/{SHA}/a%20b/c.json"
    )


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("config.json", None),
        ("original/params.json", None),
        ("../x", "holds an empty, '.' or '..' segment"),
        ("a/../../x", "holds an empty, '.' or '..' segment"),
        ("/etc/passwd", "is absolute"),
        ("a//b", "holds an empty, '.' or '..' segment"),
        ("./a", "holds an empty, '.' or '..' segment"),
        ("a\\..\\b", "holds a NUL or a backslash"),
        ("a\x00b", "holds a NUL or a backslash"),
        (".kvgate-model.json", "starts with .kvgate-, which kvgate keeps for itself"),
        ("x/.kvgate-partial/y", "starts with .kvgate-, which kvgate keeps for itself"),
        ("", "not a non-empty string"),
        (7, "not a non-empty string"),
        ("a" * 1025, "longer than 1024 characters"),
    ],
)
def test_only_plain_relative_file_names_are_written(name: object, problem: str | None) -> None:
    assert safe_name_problem(name) == problem


def test_the_listing_gives_sizes_and_lfs_checksums_and_the_commit() -> None:
    snap = parse_snapshot(
        listing(
            {"rfilename": "config.json", "size": 700, "blobId": "f" * 40},
            {
                "rfilename": "model.safetensors",
                "size": 99,  # the LFS pointer's size on some hubs: lfs.size wins
                "lfs": {"sha256": LFS_SHA, "size": 5_000_000, "pointerSize": 134},
            },
            {"rfilename": "README.md"},
        ),
        "org/m",
        "main",
    )
    assert snap.commit == SHA
    sizes = {f.path: (f.size, f.sha256) for f in snap.files}
    assert sizes == {
        "config.json": (700, None),
        "model.safetensors": (5_000_000, LFS_SHA),
        "README.md": (None, None),
    }
    assert snap.total_bytes == 5_000_700


def test_a_listing_without_a_commit_asks_by_the_revision() -> None:
    snap = parse_snapshot(listing({"rfilename": "a"}, sha=None), "org/m", "v1.0")
    assert snap.commit == "v1.0"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"<html>", "is not JSON; is the endpoint a Hugging Face Hub?"),
        (b"[]", "is not a JSON object"),
        (b'{"sha": "x"}', "has no file list (siblings)"),
        (listing(), "lists no file to download"),
        (
            listing({"rfilename": "a/b"}, {"rfilename": "a"}),
            "lists 'a' as both a file and a folder",
        ),
        (listing({"rfilename": "../a"}), "names a file '../a' that holds"),
        (listing(*[{"rfilename": f"f{i}"} for i in range(MAX_FILES + 1)]), "more than 10,000"),
    ],
)
def test_a_listing_kvgate_cannot_use_is_refused_with_the_reason(body: bytes, expected: str) -> None:
    with pytest.raises(HubError) as error:
        parse_snapshot(body, "org/m", "main")
    assert expected in str(error.value)
    assert "the hub's listing of org/m at revision main" in str(error.value)


def test_exclusions_follow_huggingface_hubs_ignore_patterns() -> None:
    assert excluded("original/consolidated.00.pth", ["original/*"])
    assert excluded("original/x/y.pth", ["original/"])
    assert excluded("a/b/c.bin", ["*.bin"])  # * matches / as in fnmatch
    assert not excluded("model.safetensors", ["*.bin", "original/*"])
    snap = parse_snapshot(
        listing({"rfilename": "a.safetensors"}, {"rfilename": "original/b.pth"}),
        "org/m",
        "main",
        exclude=["original/*"],
    )
    assert [f.path for f in snap.files] == ["a.safetensors"]


def test_status_errors_name_the_repository_the_secret_and_the_fix() -> None:
    secret = TokenSource("hub-token", "token", sent=True)
    common = {"repo": "org/m", "revision": "main", "endpoint": "https://hf.co", "token": secret}
    unauthorized = str(status_error(401, "RepoNotFound", **common))  # type: ignore[arg-type]
    assert unauthorized.startswith(
        "https://hf.co answered 401 (RepoNotFound) for repository org/m at revision main"
    )
    assert "the token from Secret hub-token key token is not accepted" in unauthorized
    gated = str(status_error(403, "GatedRepo", **common))  # type: ignore[arg-type]
    assert "accept the model's terms on the hub" in gated
    missing = str(status_error(404, "EntryNotFound", path="x.json", **common))  # type: ignore[arg-type]
    assert "'x.json' of org/m" in missing
    assert isinstance(status_error(503, None, **common), RetryableHubError)  # type: ignore[arg-type]
    assert isinstance(status_error(429, None, **common), RetryableHubError)  # type: ignore[arg-type]
    odd = str(status_error(418, "<script>", **common))  # type: ignore[arg-type]
    assert "<script>" not in odd and "check spec.model.source.download.endpoint" in odd


def test_an_empty_secret_is_said_to_have_sent_no_token() -> None:
    described = TokenSource("hub-token", "token", sent=False).describe()
    assert described == "no token was sent (Secret hub-token key token gave an empty value)"


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://hf.co/x", "https://hf.co:443/y", True),
        ("https://hf.co/x", "https://HF.co/y", True),
        ("https://hf.co/x", "https://cdn-lfs.hf.co/y", False),
        ("https://hf.co/x", "http://hf.co/y", False),
        ("http://10.0.0.1:8080/x", "http://10.0.0.1:8081/y", False),
        ("https://hf.co/x", "https://hf.co:bad/y", False),
    ],
)
def test_the_token_goes_only_to_the_same_origin(a: str, b: str, same: bool) -> None:
    assert same_origin(a, b) is same
