"""What the cluster admin decides for every ModelDeployment (chart values), as admission input."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvgate_engine.shape_limits import MAX_GPUS_PER_NODE
from packaging.version import InvalidVersion, Version

from kvgate.admission.host_paths import HostPathPolicy

FLOOR_SETTING = "engineVersionFloor"  # the chart value (env KVGATE_MIN_ENGINE_VERSION_FLOOR)
GPUS_PER_NODE_SETTING = "gpusPerNode"  # the chart value (env KVGATE_GPUS_PER_NODE)
GPUS_PER_NODE_ENV = "KVGATE_GPUS_PER_NODE"


@dataclass(frozen=True)
class ClusterPolicy:
    """Cluster-wide admission rules. `min_engine_version_floor`: no ModelDeployment may allow an
    engine version below it, in `safety.minEngineVersion` or in its image tag (None: no floor
    beyond each spec's own). `gpus_per_node`: the GPUs each of the cluster's GPU nodes has, when
    the admin states it (None: only the hard limit, api.MAX_GPUS_PER_NODE).
    `gpu_reserved_gib_by_product`: the reserve per GPU measured on the cluster's GPUs, by
    nvidia.com/gpu.product (kvgate.admission.gpu_reserve). `host_paths`: the node directories a
    ModelDeployment may mount (kvgate.admission.host_paths; by default no model hostPath and only
    /dev/infiniband for RDMA)."""

    min_engine_version_floor: str | None = None
    gpus_per_node: int | None = None
    gpu_reserved_gib_by_product: Mapping[str, float] = field(default_factory=dict)
    host_paths: HostPathPolicy = field(default_factory=HostPathPolicy)

    def __post_init__(self) -> None:
        if self.min_engine_version_floor is not None:
            parse_floor(self.min_engine_version_floor)
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"gpusPerNode {self.gpus_per_node}: must be 1 or more, e.g. 8")
        if self.gpus_per_node is not None and self.gpus_per_node > MAX_GPUS_PER_NODE:
            raise ValueError(
                f"gpusPerNode {self.gpus_per_node}: must be at most {MAX_GPUS_PER_NODE} (no GPU "
                "node has more); give the GPUs of one node, e.g. 8"
            )

    @functools.cached_property
    def floor(self) -> Version | None:
        """The cluster floor as a version (validated at construction)."""
        if self.min_engine_version_floor is None:
            return None
        return parse_floor(self.min_engine_version_floor)


def parse_gpus_per_node(raw: str | None) -> int | None:
    """KVGATE_GPUS_PER_NODE as a count (None when unset); ValueError naming the chart value."""
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_GPUS_PER_NODE:
        raise ValueError(
            f"{GPUS_PER_NODE_ENV}={raw!r} (the chart value {GPUS_PER_NODE_SETTING}): must be a "
            f"whole number >= 1 and at most {MAX_GPUS_PER_NODE}, the GPUs each GPU node has "
            "(e.g. 8); unset it when unknown"
        )
    return value


def parse_floor(value: str) -> Version:
    """The floor as a PEP 440 version; ValueError naming the setting when it is not one."""
    try:
        return Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a version; use one such as 0.5.22") from None
