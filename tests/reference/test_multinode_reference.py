"""The reference engine as a multi-node engine (real processes on loopback): rank 0 serves nothing
until every rank joined at --dist-init-addr, reports the pool of the whole tp_size, and the engine
ends when a rank leaves (as SGLang's does)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import aiohttp
import pytest
from conftest import EngineLauncher, RunningEngine, free_port, loopback_host
from kvgate_engine.reference.args import DEFAULT_VERSION, parse_launch_args
from kvgate_engine.reference.ranks import RankError, RankServer, join, split_addr

DEADLINE = 60.0


def _group_flags(host: str, port: int, rank: int, nnodes: int = 2, tp: int = 2) -> list[str]:
    return [
        "--tp-size",
        str(tp),
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(rank),
        "--dist-init-addr",
        f"{host}:{port}",
        "--watchdog-timeout",
        "60",
    ]


async def _answers(engine: RunningEngine) -> bool:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{engine.url}/health", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200
    return False


async def _exit_code(engine: RunningEngine, deadline: float = DEADLINE) -> int:
    end = time.monotonic() + deadline
    while engine.process.poll() is None:
        assert time.monotonic() < end, f"still running after {deadline} s:\n{engine.log()}"
        await asyncio.sleep(0.1)
    return int(engine.process.returncode)


async def test_leader_serves_only_once_every_rank_joined_and_ends_when_one_leaves(
    engines: EngineLauncher,
) -> None:
    host = loopback_host()
    dist_port = free_port(host)
    leader = engines.spawn(*_group_flags(host, dist_port, 0), host=host, role="decode")
    # Long enough for the leader to start and listen: it still does not serve.
    end = time.monotonic() + 8
    while time.monotonic() < end:
        assert leader.process.poll() is None, leader.log()
        assert not await _answers(leader), "rank 0 answered before rank 1 joined"
        await asyncio.sleep(0.5)
    worker = engines.spawn(*_group_flags(host, dist_port, 1), host=host, role="decode")
    await engines.wait_healthy(leader)
    assert worker.process.poll() is None  # a rank >= 1 keeps running, serving nothing
    status, info = await engines.get_json(f"{leader.url}/server_info")
    assert status == 200 and info["max_total_num_tokens"] > 0
    # One rank leaves (SIGKILL, as a node loss): the engine ends, leader exits with an error.
    worker.process.send_signal(signal.SIGKILL)
    assert await _exit_code(leader) == 1
    assert "rank 1 left the engine" in leader.log()


async def test_a_rank_whose_leader_goes_away_exits_with_an_error(engines: EngineLauncher) -> None:
    host = loopback_host()
    dist_port = free_port(host)
    leader = engines.spawn(*_group_flags(host, dist_port, 0), host=host, role="prefill")
    worker = engines.spawn(*_group_flags(host, dist_port, 1), host=host, role="prefill")
    await engines.wait_healthy(leader)
    leader.process.send_signal(signal.SIGKILL)
    assert await _exit_code(worker) == 1
    assert "went away" in worker.log()


def test_pool_of_a_group_is_the_single_node_pool_of_the_same_tp_size() -> None:
    """The pool model: --tp-size is the whole engine's; nodes do not change the arithmetic."""
    from kvgate_engine.reference.main import startup_limits

    env = {"KVGATE_GPU_MEMORY_GIB": "80"}
    one = parse_launch_args(["--model-path", "tiny-llama", "--tp-size", "4"])
    two = parse_launch_args(
        ["--model-path", "tiny-llama", *_group_flags("10.0.0.2", 20000, 1, nnodes=2, tp=4)]
    )
    pools = [
        startup_limits(launch, env, DEFAULT_VERSION)[1].kv_pool_tokens for launch in (one, two)
    ]
    assert pools[0] == pools[1]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--nnodes", "2"], "needs --dist-init-addr"),
        (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], "0..1"),
        (["--nnodes", "3", "--tp-size", "4", "--dist-init-addr", "h:1"], "divisible"),
    ],
)
def test_inconsistent_topology_flags_exit_2(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_launch_args(["--model-path", "tiny-llama", *flags])
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


async def test_rank_server_refuses_duplicates_strangers_and_mismatched_shapes() -> None:
    host = loopback_host()
    port = free_port(host)
    group = RankServer(nnodes=3, tp_size=6)
    await group.start(host, port)
    try:
        addr = f"{host}:{port}"
        with pytest.raises(RankError, match="--nnodes 2 --tp-size 6"):
            await join(addr, 1, 2, 6, 5)
        with pytest.raises(RankError, match=r"not one of 1\.\.2"):
            await join(addr, 0, 3, 6, 5)
        first = asyncio.ensure_future(join(addr, 1, 3, 6, 5))
        await asyncio.sleep(0.3)
        with pytest.raises(RankError, match="already joined"):
            await join(addr, 1, 3, 6, 5)
        assert not group.joined.is_set()
        second = asyncio.ensure_future(join(addr, 2, 3, 6, 5))
        await asyncio.wait_for(group.joined.wait(), 5)
        assert group.ranks() == [1, 2]
    finally:
        await group.close()
    await asyncio.wait_for(asyncio.gather(first, second), 5)  # ranks end with their leader


def test_dist_init_addr_must_be_host_and_port() -> None:
    assert split_addr("llama-0.llama.ns:20000") == ("llama-0.llama.ns", 20000)
    assert split_addr("[fd00::1]:20000") == ("fd00::1", 20000)
    with pytest.raises(ValueError, match="host:port"):
        split_addr("llama-0")


async def test_a_corrupt_slot_on_a_worker_rank_is_logged_by_that_rank_not_the_leader(
    engines: EngineLauncher,
) -> None:
    """SGLang's every rank runs its own canary and logs its own violations; a node-rank-1 pod runs
    only schedulers, so the line is in its log alone. ``POST /kvgate/canary/corrupt`` with
    ``{"rank": 1}`` on the leader corrupts a slot of rank 1 (told over the group's connection)."""
    host = loopback_host()
    dist_port = free_port(host)
    canary = ("--kv-canary", "log")
    leader = engines.spawn(*_group_flags(host, dist_port, 0), *canary, host=host, role="decode")
    worker = engines.spawn(*_group_flags(host, dist_port, 1), *canary, host=host, role="decode")
    await engines.wait_healthy(leader)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{leader.url}/kvgate/canary/corrupt", json={"rank": 1}) as response,
    ):
        assert response.status == 200, await response.text()
    end = time.monotonic() + DEADLINE
    while "kv_canary violation:" not in worker.log():
        assert time.monotonic() < end, worker.log()
        await asyncio.sleep(0.1)
    assert "kv_canary violation: launch_tag=" in worker.log()
    assert "kv_canary violation:" not in leader.log()
    assert worker.process.poll() is None and leader.process.poll() is None  # the group serves on
