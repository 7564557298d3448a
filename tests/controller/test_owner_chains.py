"""A proven ReplicaSet -> Deployment chain serves its sibling pods for a short while
(kvgate.controller.identity; two GETs per pod were 18,000 reads for the scale target's 1,000
ModelDeployments); every sibling is still checked against it, and a recreated ReplicaSet or an
expired entry is read again."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kmock
import pytest
from factories.kmock_world import engine_pod, requests
from factories.model_deployments import MD_UID
from kvgate.controller.identity import resolve_identity
from kvgate.controller.runtime import OwnerChains, Runtime
from kvgate.verify.pod_identity import EngineIdentity, Unproven


def _sibling(index: int, **labels: str) -> dict[str, Any]:
    pod = copy.deepcopy(engine_pod(8000))
    pod["metadata"]["name"] += f"-{index}"
    pod["metadata"]["uid"] = f"pod-uid-sibling-{index}"
    pod["metadata"]["labels"].update(labels)
    return pod


def _chain_reads(km: kmock.KubernetesEmulator) -> int:
    """GETs of a ReplicaSet or a Deployment so far."""
    return sum(
        1
        for r in requests(km, "GET")
        if "/replicasets/" in str(r.url.path) or "/deployments/" in str(r.url.path)
    )


@pytest.mark.usefixtures("revision_chain")
async def test_sibling_pods_of_one_replica_set_are_proven_with_one_pair_of_reads(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    results = [await resolve_identity(rt, _sibling(i), MD_UID) for i in range(4)]
    assert all(isinstance(r, EngineIdentity) and r.role == "decode" for r in results), results
    assert _chain_reads(kmock) == 2  # one ReplicaSet and one Deployment read, for four pods


@pytest.mark.usefixtures("revision_chain")
async def test_siblings_first_seen_at_once_share_one_pair_of_reads(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    """A ReplicaSet's pods are first seen together, before any of them proved the chain."""
    results = await asyncio.gather(*(resolve_identity(rt, _sibling(i), MD_UID) for i in range(4)))
    assert all(isinstance(r, EngineIdentity) and r.role == "decode" for r in results), results
    assert _chain_reads(kmock) == 2


async def test_a_read_one_caller_gave_up_on_still_serves_the_others() -> None:
    chains = OwnerChains()
    release = asyncio.Event()
    calls = 0

    async def read() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "chain"

    key = ("ns", "rs", "uid")
    first = asyncio.create_task(chains.read_once(key, read))
    await asyncio.sleep(0)
    second = asyncio.create_task(chains.read_once(key, read))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "chain"
    assert calls == 1
    assert await chains.read_once(key, read) == "chain" and calls == 2  # done: read afresh


@pytest.mark.usefixtures("revision_chain")
async def test_a_relabelled_sibling_is_not_proven_by_the_cached_chain(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    assert isinstance(await resolve_identity(rt, _sibling(0), MD_UID), EngineIdentity)
    relabelled = await resolve_identity(rt, _sibling(1, **{"kvgate.io/role": "prefill"}), MD_UID)
    assert isinstance(relabelled, Unproven)
    assert "was the pod relabelled" in relabelled.message


@pytest.mark.usefixtures("revision_chain")
async def test_a_pod_of_a_recreated_replica_set_is_read_again(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    assert isinstance(await resolve_identity(rt, _sibling(0), MD_UID), EngineIdentity)
    other = _sibling(1)
    other["metadata"]["ownerReferences"][0]["uid"] = "rs-decode-recreated"
    result = await resolve_identity(rt, other, MD_UID)
    assert isinstance(result, Unproven)  # the API's ReplicaSet has another uid
    assert _chain_reads(kmock) == 4


def test_an_entry_expires_after_its_ttl_and_expired_ones_are_dropped() -> None:
    now = [100.0]
    chains = OwnerChains(ttl=30.0, clock=lambda: now[0])
    chains.put(("ns", "rs-a", "uid-a"), "chain-a")
    now[0] = 120.0
    chains.put(("ns", "rs-b", "uid-b"), "chain-b")
    assert chains.get(("ns", "rs-a", "uid-a")) == "chain-a"
    now[0] = 131.0
    assert chains.get(("ns", "rs-a", "uid-a")) is None
    assert chains.get(("ns", "rs-b", "uid-b")) == "chain-b"
    chains.put(("ns", "rs-c", "uid-c"), "chain-c")
    assert len(chains) == 2  # rs-a dropped
