"""A ModelDeployment role -> the launcher input (kvgate_engine.launcher.EngineLaunch). Pure.

The engine package takes plain values and never imports the API models; this is the one place
that knows which spec field becomes which launch setting.
"""

from __future__ import annotations

from kvgate_engine.launcher import EngineLaunch

from kvgate.api import multinode
from kvgate.api.models import ModelDeploymentSpec, Role


def engine_launch(
    spec: ModelDeploymentSpec, role: Role, node_rank: str = multinode.LEADER_RANK
) -> EngineLaunch:
    """The launch settings of one engine container of ``role``; with ``nodes`` > 1, of the pod
    of rank ``node_rank`` (the leader's "0", or a worker's $(LWS_WORKER_INDEX))."""
    role_spec = spec.prefill if role is Role.PREFILL else spec.decode
    engine = spec.engine
    many = multinode.is_multi_node(role_spec)
    return EngineLaunch(
        role="prefill" if role is Role.PREFILL else "decode",
        image=engine.image,
        model_path=spec.model.path,
        served_model_name=spec.model.name,
        port=engine.port,
        context_length=spec.model.context_length,
        mem_fraction_static=role_spec.mem_fraction_static,
        tensor_parallel=role_spec.tensor_parallel,
        page_size=engine.page_size,
        kv_cache_dtype=str(engine.kv_cache_dtype),
        transfer_backend=str(engine.transfer.backend),
        bootstrap_port=engine.bootstrap_port,
        ib_devices=tuple(engine.transfer.ib_devices),
        api_key_from_env=engine.api_key_secret_ref is not None,
        max_total_tokens=role_spec.max_total_tokens,
        kv_checksum=spec.safety.kv_checksum,
        kv_canary=spec.safety.kv_canary,
        deferred_decode_kv_release=spec.safety.deferred_decode_kv_release,
        extra_args=tuple(engine.args),
        nnodes=role_spec.nodes,
        node_rank=node_rank if many else multinode.LEADER_RANK,
        dist_init_addr=multinode.dist_init_addr(engine) if many else None,
    )
