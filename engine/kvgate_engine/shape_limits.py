"""How large one engine may be: GPUs per node, nodes per engine, memory per GPU. Pure data.

The API model's bounds (``kvgate.api.models``) and the estimator's checks of its inputs
(``kvgate estimate``, ``kvgate plan``, admission) read them from here, so a size one of them
refuses the others refuse too.
"""

from __future__ import annotations

MAX_GPUS_PER_NODE = 16  # GPUs one engine pod asks for: no node has more
MAX_ENGINE_NODES = 32  # pods (nodes) of one multi-node engine: a LeaderWorkerSet group's size
# GPUs of one engine (--tp-size) across all its nodes.
MAX_TENSOR_PARALLEL = MAX_GPUS_PER_NODE * MAX_ENGINE_NODES
# Memory of one GPU in GiB: 50x the largest shipping today (288 GiB). A value above it is a typo
# or a unit mix-up (MiB for GiB), and sizing it makes pools of 10^20 tokens and more.
MAX_GPU_MEMORY_GIB = 16_384
