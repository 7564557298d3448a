"""Conformance: a multi-node engine's argv (leader and worker) parses with SGLang's own parser and
SGLang reads the topology kvgate means: --nnodes, --node-rank, --dist-init-addr, --tp-size.

The argv holds $(LWS_LEADER_ADDRESS) and $(LWS_WORKER_INDEX); the kubelet expands them from the
environment LeaderWorkerSet's pod webhook gives each container, so the test expands them the same
way before SGLang parses. Versions: those the default engine floor admits (older engines are never
verified, whatever they parse).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from factories.release_answers import ask_release
from kvgate.api import multinode
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.objects.engine_launch import engine_launch
from kvgate_engine.launcher import engine_argv
from test_sglang_argv import UNKNOWN_FLAG, model_dir, sglang_envs

pytestmark = pytest.mark.conformance

__all__ = ["model_dir", "sglang_envs"]  # module fixtures this file uses

VERSIONS = ("0.5.23", "0.5.22")
LEADER_ADDRESS = "llama-1a2b3c4d5e-decode-0.llama-1a2b3c4d5e-decode.team-a"

PARSER = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args

FIELDS = ["nnodes", "node_rank", "dist_init_addr", "tp_size", "disaggregation_mode", "port",
          "disaggregation_bootstrap_port"]
results = []
for argv in json.load(sys.stdin):
    try:
        args = prepare_server_args(argv)
    except SystemExit as exc:
        results.append({"exit": exc.code})
        continue
    except BaseException as exc:
        results.append({"exit": "exception", "error": f"{type(exc).__name__}: {exc}"})
        continue
    results.append({"exit": 0, "values": {f: getattr(args, f, None) for f in FIELDS}})
print("KVGATE-RESULTS " + json.dumps(results))
"""

_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args (a reference to an unset variable stays)."""
    return [_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), arg) for arg in argv]


def parse_with_sglang(target: Path, argvs: list[list[str]], model: Path) -> list[dict[str, Any]]:
    """Each argv through SGLang's prepare_server_args, in that release's own environment."""
    parsed: list[dict[str, Any]] = ask_release(target, PARSER, argvs, reads=[model / "config.json"])
    return parsed


def group_spec(version: str, model: Path) -> ModelDeploymentSpec:
    return ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.1-8b", "path": str(model), "contextLength": 131072},
            "engine": {"image": f"lmsysorg/sglang:v{version}"},
            "prefill": {"nodes": 2, "tensorParallel": 16},
            "decode": {"nodes": 4, "tensorParallel": 32},
        }
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_multi_node_argv_parses_with_sglang_as_the_topology_kvgate_means(
    version: str, sglang_envs: dict[str, Path], model_dir: Path
) -> None:
    spec = group_spec(version, model_dir)
    # (role, the rank given to the launcher mapping, LWS_WORKER_INDEX in that pod)
    pods = [
        (Role.PREFILL, multinode.LEADER_RANK, "0"),
        (Role.PREFILL, multinode.WORKER_RANK, "1"),
        (Role.DECODE, multinode.LEADER_RANK, "0"),
        (Role.DECODE, multinode.WORKER_RANK, "3"),
    ]
    inputs: list[list[str]] = []
    for role, rank, index in pods:
        argv = engine_argv(engine_launch(spec, role, node_rank=rank))
        env = {"LWS_LEADER_ADDRESS": LEADER_ADDRESS, "LWS_WORKER_INDEX": index}
        inputs.append(expand(argv, env)[3:])  # what launch_server hands the parser
    # Controls: an unknown flag fails (exit 2), and so does a worker whose rank was not expanded
    # (the parser really reads --node-rank as a number: a pod without LeaderWorkerSet's
    # environment exits instead of joining as some rank).
    inputs.append([*inputs[0], UNKNOWN_FLAG])
    unexpanded = engine_argv(engine_launch(spec, Role.DECODE, node_rank=multinode.WORKER_RANK))
    inputs.append(expand(unexpanded, {"LWS_LEADER_ADDRESS": LEADER_ADDRESS})[3:])

    results = parse_with_sglang(sglang_envs[version], inputs, model_dir)
    assert len(results) == len(inputs)
    assert results.pop()["exit"] != 0, "an unexpanded $(LWS_WORKER_INDEX) was accepted"
    assert results.pop()["exit"] == 2, f"sglang {version} accepted {UNKNOWN_FLAG}"
    for (role, _, index), result in zip(pods, results, strict=True):
        assert result["exit"] == 0, f"sglang {version} rejected {role} rank {index}: {result}"
        role_spec = spec.prefill if role is Role.PREFILL else spec.decode
        want: dict[str, Any] = {
            "nnodes": role_spec.nodes,
            "node_rank": int(index),
            "dist_init_addr": f"{LEADER_ADDRESS}:{multinode.DIST_INIT_PORT}",
            "tp_size": role_spec.tensor_parallel,
            "disaggregation_mode": role.value,
        }
        got = {key: result["values"][key] for key in want}
        assert got == want, f"sglang {version} read {role} rank {index} as {got}"


def test_expand_follows_kubernetes_references() -> None:
    assert expand(["$(A):1", "x$(B)", "$(C)"], {"A": "h", "B": "2"}) == ["h:1", "x2", "$(C)"]
    assert json.dumps(expand(["--a"], {})) == '["--a"]'
