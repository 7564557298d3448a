"""A revision names everything in a ModelDeployment spec that changes what the engines are.

Two specs with the same revision run identical engines and an identical router; replicas and
rollout settings are not part of it (scaling is not a rollout, nor are its autoscaling bounds).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvgate.api.models import (
    DEFAULT_ACCELERATOR_RESOURCE,
    DEFAULT_GPU_RESERVED_GIB,
    ModelDeploymentSpec,
)

REVISION_LENGTH = 10

# Pod fields that came after the first revisions, with the value every earlier spec ran: at that
# value they leave a revision as it was (no roll on upgrade); any other value is a new revision,
# as nodeSelector and tolerations always were (they change the pods).
_ENGINE_POD_DEFAULTS: dict[str, Any] = {
    "acceleratorResource": DEFAULT_ACCELERATOR_RESOURCE,
    "podLabels": {},
    "podAnnotations": {},
    "serviceAccountName": None,
    "priorityClassName": None,
    "imagePullSecrets": [],
    "topologySpreadConstraints": [],
    "extraVolumes": [],
    "extraVolumeMounts": [],
    "extraEnv": [],
}
_ROUTER_POD_DEFAULTS: dict[str, Any] = {
    "resources": {"limits": {}, "requests": {}},
    "nodeSelector": {},
    "tolerations": [],
    "affinity": None,
    "imagePullSecrets": [],
}


def _drop_defaults(doc: dict[str, Any], defaults: dict[str, Any]) -> None:
    for key, default in defaults.items():
        if key in doc and doc[key] == default:
            del doc[key]


def revision_inputs(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """The part of the spec that defines a revision, as plain JSON data."""
    doc: dict[str, Any] = spec.model_dump(
        mode="json", by_alias=True, exclude={"rollout", "prefill_per_decode"}
    )
    for role in ("prefill", "decode", "router"):
        doc[role].pop("replicas", None)
        doc[role].pop("autoscaling", None)
    for role in ("prefill", "decode"):
        # nodes came with multi-node engines; its default (one pod per engine) is what every
        # earlier spec ran, so it leaves their revisions as they were (no roll on upgrade).
        if doc[role].get("nodes") == 1:
            del doc[role]["nodes"]
    # An unset gpuReservedGiB (the cluster's measured reserve, else 1 GiB) hashes as the 1 GiB
    # every earlier spec was defaulted to: only admission's estimate reads it, not the engines.
    for role in ("prefill", "decode"):
        if doc[role].get("gpuReservedGiB") is None:
            doc[role]["gpuReservedGiB"] = DEFAULT_GPU_RESERVED_GIB
    for role in ("prefill", "decode"):
        _drop_defaults(doc[role], _ENGINE_POD_DEFAULTS)
    _drop_defaults(doc["router"], _ROUTER_POD_DEFAULTS)
    # safety.deferredDecodeKvRelease came after the first revisions; at its default it names no
    # new revision (no roll on upgrade: the engine template's env changes under the same revision,
    # its pods verified as any), and SGLang >= 0.5.21 already ran with it on by its own default.
    if doc["safety"].get("deferredDecodeKvRelease") is True:
        del doc["safety"]["deferredDecodeKvRelease"]
    # model.source came with model sources; a spec without one runs what it always ran.
    if doc["model"].get("source") is None:
        doc["model"].pop("source", None)
    return doc


def revision_of(spec: ModelDeploymentSpec) -> str:
    """Short stable hash (lower-case hex, a valid label value) of the revision inputs."""
    canonical = json.dumps(revision_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]
