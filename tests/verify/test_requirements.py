"""Each engine pod's requirement comes from its ModelDeployment, never from the pod."""

from __future__ import annotations

from kvgate.api import requirements
from kvgate.api.models import ModelDeploymentSpec
from kvgate_engine.verdict import Requirement

SPEC = ModelDeploymentSpec.model_validate(
    {
        "model": {"name": "m", "path": "/models/m", "contextLength": 131072},
        "engine": {"image": "lmsysorg/sglang:v0.5.23"},
        "safety": {"headroom": 1.5, "minEngineVersion": "0.5.22"},
    }
)
OLD = {
    "revision": "0ld0ld0ld0",
    "contextLength": 65536,
    "headroom": 1.0,
    "minEngineVersion": "0.5.22",
}


def req(revision: str, status: dict | None = None, floor: str | None = None) -> object:
    return requirements.requirement_for(
        spec=SPEC,
        target_revision="t4rg3t0000",
        status=status,
        revision=revision,
        role="decode",
        cluster_floor=floor,
    )


def test_target_revision_pods_must_prove_the_current_spec() -> None:
    assert req("t4rg3t0000") == Requirement(131072, 1.5, "decode", "0.5.22")


def test_older_revision_pods_must_prove_what_was_recorded_when_they_rolled_out() -> None:
    assert req("0ld0ld0ld0", {"revisions": [OLD]}) == Requirement(65536, 1.0, "decode", "0.5.22")


def test_a_revision_with_no_record_cannot_be_verified() -> None:
    assert req("0ld0ld0ld0", {}) is None
    assert req("0ld0ld0ld0", None) is None
    assert req("0th3r00000", {"revisions": [OLD]}) is None


def test_malformed_records_are_ignored_not_trusted() -> None:
    for bad in (
        {**OLD, "contextLength": 0},
        {**OLD, "contextLength": "1"},
        {**OLD, "contextLength": True},
        {**OLD, "headroom": 0.5},
        {**OLD, "minEngineVersion": ""},
        {**OLD, "revision": None},
        # What the CRD (generated from RevisionRecord) never lets into the status.
        {**OLD, "minEngineVersion": "0." * 40},
        {**OLD, "contextLength": 65536, "pool": 1},
        "not a record",
    ):
        assert req("0ld0ld0ld0", {"revisions": [bad]}) is None, bad


def test_the_cluster_floor_raises_a_lower_spec_floor_and_never_lowers_a_higher_one() -> None:
    assert req("t4rg3t0000", floor="0.5.23").min_version == "0.5.23"  # type: ignore[attr-defined]
    assert req("t4rg3t0000", floor="0.5.19").min_version == "0.5.22"  # type: ignore[attr-defined]
    assert req("t4rg3t0000", floor=None).min_version == "0.5.22"  # type: ignore[attr-defined]
    # An unparseable cluster floor is kept, so the verdict fails closed on it.
    assert req("t4rg3t0000", floor="garbage").min_version == "garbage"  # type: ignore[attr-defined]


def test_a_record_written_before_headroom_existed_holds_one() -> None:
    old = {k: v for k, v in OLD.items() if k != "headroom"}
    assert req("0ld0ld0ld0", {"revisions": [old]}) == Requirement(65536, 1.0, "decode", "0.5.22")


def test_records_keep_the_target_and_running_revisions_and_never_rewrite_one() -> None:
    target = requirements.record_of(SPEC, "t4rg3t0000")
    gone = {**OLD, "revision": "g0neg0ne00"}
    out = requirements.updated_records({"revisions": [OLD, gone]}, target, keep={"0ld0ld0ld0"})
    assert [r["revision"] for r in out] == ["t4rg3t0000", "0ld0ld0ld0"]
    # A recorded revision keeps its record even if a later spec maps to the same hash.
    changed = {**target, "contextLength": 1}
    again = requirements.updated_records({"revisions": out}, changed, keep=set())
    assert again[0]["contextLength"] == 131072
