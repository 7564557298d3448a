"""Fixtures for the tests that run the operator against the kmock API emulator (tests/controller,
tests/kube, tests/rollout, tests/verify): a Runtime, and the ownership chain an engine pod is
verified through (builders in factories.kmock_world). tests/conftest.py loads this module as a
plugin, so every folder's tests can ask for ``rt``, ``operator_settings`` and
``revision_chain``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from kvgate.controller.main import make_verify
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings

from factories.kmock_world import declare_resources, put_revision_chain
from factories.model_deployments import NOW


@pytest.fixture
def operator_settings() -> OperatorSettings:
    """The settings ``rt`` runs with; a test module overrides this fixture to change them."""
    return OperatorSettings(probe_timeout_seconds=2.0)


@pytest.fixture
async def rt(
    kmock: kmock.KubernetesEmulator, operator_settings: OperatorSettings
) -> AsyncIterator[Runtime]:
    """The operator's Runtime against kmock (every resource kvgate uses declared), its clock
    stopped at NOW."""
    declare_resources(kmock)
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    runtime = Runtime(
        api=api,
        settings=operator_settings,
        verify=make_verify(operator_settings),
        clock=lambda: NOW,
    )
    yield runtime
    await runtime.shutdown()
    await api.close()


@pytest.fixture
def revision_chain(kmock: kmock.KubernetesEmulator) -> None:
    """The ModelDeployment, its revision Deployments and their ReplicaSets in kmock."""
    put_revision_chain(kmock)
