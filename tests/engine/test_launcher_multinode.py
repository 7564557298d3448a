"""The launcher for multi-node engines: --nnodes, --node-rank and --dist-init-addr (the leader's
stable LeaderWorkerSet name), only when an engine spans more than one pod."""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_deployments import spec_of
from kvgate.api import multinode
from kvgate.api.models import Role
from kvgate.objects.engine_launch import engine_launch
from kvgate_engine.launcher import EngineLaunch, engine_argv

TOPOLOGY = ("--nnodes", "--node-rank", "--dist-init-addr")


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_single_node_engine_gets_no_topology_flags() -> None:
    argv = engine_argv(engine_launch(spec_of(), Role.DECODE))
    assert not set(TOPOLOGY) & set(argv)


# (case, role, node rank given to the mapping, expected --node-rank)
RANKS = [
    ("leader of a decode group", Role.DECODE, multinode.LEADER_RANK, "0"),
    ("worker of a decode group", Role.DECODE, multinode.WORKER_RANK, "$(LWS_WORKER_INDEX)"),
    ("leader of a prefill group", Role.PREFILL, multinode.LEADER_RANK, "0"),
    ("worker of a prefill group", Role.PREFILL, multinode.WORKER_RANK, "$(LWS_WORKER_INDEX)"),
]


@pytest.mark.parametrize(
    ("role", "rank", "want"), [r[1:] for r in RANKS], ids=[r[0] for r in RANKS]
)
def test_multi_node_engine_names_its_size_rank_and_leader(role: Role, rank: str, want: str) -> None:
    spec = spec_of(
        prefill={"nodes": 2, "tensorParallel": 16}, decode={"nodes": 4, "tensorParallel": 32}
    )
    argv = engine_argv(engine_launch(spec, role, node_rank=rank))
    nodes = 2 if role is Role.PREFILL else 4
    assert flag_value(argv, "--nnodes") == str(nodes)
    assert flag_value(argv, "--node-rank") == want
    assert flag_value(argv, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
    # --tp-size is the whole engine's, across its nodes
    assert flag_value(argv, "--tp-size") == str(16 if role is Role.PREFILL else 32)
    # kvgate's flags come before the user's, which stay last
    assert argv.index("--dist-init-addr") < len(argv) - 1


def test_dist_init_port_block_avoids_the_engines_own_ports() -> None:
    spec = spec_of(
        engine={"image": "lmsysorg/sglang:v0.5.23", "port": 20003, "bootstrapPort": 20017},
        decode={"nodes": 2, "tensorParallel": 2},
    )
    argv = engine_argv(engine_launch(spec, Role.DECODE, node_rank=multinode.WORKER_RANK))
    port = int(flag_value(argv, "--dist-init-addr").rsplit(":", 1)[1])
    block = range(port, port + multinode.DIST_INIT_PORT_SPAN)
    assert 20003 not in block and 20017 not in block
    assert port == 20032


def test_rank_of_a_single_node_engine_is_always_zero() -> None:
    launch = engine_launch(spec_of(), Role.DECODE, node_rank=multinode.WORKER_RANK)
    assert launch.nnodes == 1 and launch.node_rank == "0" and launch.dist_init_addr is None


def test_a_multi_node_launch_without_a_leader_address_is_refused() -> None:
    fields: dict[str, Any] = {
        "role": "decode",
        "image": "lmsysorg/sglang:v0.5.23",
        "model_path": "/m",
        "served_model_name": "m",
        "port": 30000,
        "context_length": 8192,
        "mem_fraction_static": 0.85,
        "tensor_parallel": 2,
        "page_size": 1,
        "kv_cache_dtype": "auto",
        "transfer_backend": "mooncake",
        "bootstrap_port": 8998,
    }
    with pytest.raises(ValueError, match="dist_init_addr"):
        EngineLaunch(**fields, nnodes=2)
    with pytest.raises(ValueError, match="nnodes 0"):
        EngineLaunch(**fields, nnodes=0)
