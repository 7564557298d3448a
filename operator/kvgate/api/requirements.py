"""What each revision's engines must prove, derived only from what the operator itself wrote (pure).

A pod's requirement never comes from the pod (a namespace editor may annotate pods). It comes from
the ModelDeployment: the current spec for the target revision, and, for older revisions still
running (the serving one during a rollout), the record the operator keeps in
``status.revisions`` (the status subresource, which tenants who may edit the spec cannot write).
A revision with no record cannot be verified: "could not tell" is never "safe".

The engine version floor is the larger of the spec's ``safety.minEngineVersion`` and the
cluster-wide floor the operator was installed with (chart value), so no ModelDeployment can go
below what the cluster admin set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvgate_engine.verdict import Requirement
from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from kvgate.api.models import ModelDeploymentSpec, RevisionRecord

Record = dict[str, Any]  # a RevisionRecord as the status holds it (camelCase keys)
STATUS_FIELD = "revisions"
# Records kept for revisions that no longer run are pruned; this bounds status growth when a
# revision's workloads linger (they are deleted once a successor serves).
MAX_RECORDS = 10


def effective_floor(spec_floor: str, cluster_floor: str | None) -> str:
    """The higher of two engine version floors (an unparseable one wins: it fails closed)."""
    if not cluster_floor:
        return spec_floor
    try:
        return cluster_floor if Version(cluster_floor) > Version(spec_floor) else spec_floor
    except InvalidVersion:
        # The verdict reports an unparseable floor as "could not tell"; never silently drop it.
        return spec_floor if _invalid(spec_floor) else cluster_floor


def _invalid(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return True
    return False


def record_of(spec: ModelDeploymentSpec, revision: str) -> Record:
    """The requirement of one revision, as kept in ``status.revisions``."""
    return RevisionRecord(
        revision=revision,
        context_length=spec.model.context_length,
        headroom=spec.safety.headroom,
        min_engine_version=spec.safety.min_engine_version,
    ).model_dump(by_alias=True)


def records_in(status: Mapping[str, Any] | None) -> dict[str, Record]:
    """Valid records of ``status.revisions`` by revision (malformed entries are ignored)."""
    out: dict[str, Record] = {}
    for item in (status or {}).get(STATUS_FIELD) or []:
        if not isinstance(item, Mapping):
            continue
        rec = _valid(item)
        if rec is not None:
            out[rec["revision"]] = rec
    return out


def _valid(item: Mapping[str, Any]) -> Record | None:
    """The record as the API's own RevisionRecord reads it, strictly (no "1" or true for a
    number); a record without headroom (written before the field existed) holds 1.0."""
    try:
        record = RevisionRecord.model_validate({"headroom": 1.0, **item}, strict=True)
    except ValidationError:
        return None
    return record.model_dump(by_alias=True)


def updated_records(
    previous: Mapping[str, Any] | None,
    target: Record,
    keep: Iterable[str],
) -> list[Record]:
    """``status.revisions`` after a pass: the target's record plus those of revisions in ``keep``
    (still running), newest first; never rewritten for a revision already recorded (a revision's
    requirement is fixed by its hash)."""
    known = records_in(previous)
    keep_set = set(keep)
    out: list[Record] = [known.get(target["revision"], target)]
    for rev, rec in known.items():
        if rev != target["revision"] and rev in keep_set:
            out.append(rec)
    return out[:MAX_RECORDS]


def requirement_for(
    *,
    spec: ModelDeploymentSpec,
    target_revision: str,
    status: Mapping[str, Any] | None,
    revision: str,
    role: str,
    cluster_floor: str | None,
) -> Requirement | None:
    """The requirement of ``revision``'s ``role`` engines, or None when it is not known."""
    if revision == target_revision:
        rec: Record | None = record_of(spec, revision)
    else:
        rec = records_in(status).get(revision)
    if rec is None:
        return None
    return Requirement(
        context_length=int(rec["contextLength"]),
        headroom=float(rec["headroom"]),
        role=role,
        min_version=effective_floor(str(rec["minEngineVersion"]), cluster_floor),
    )
