"""Shared pieces for the admission and webhook tests (tests/admission, tests/webhook): a safe
sample, mutations of it, AdmissionReviews, a live HTTPS webhook and a client of it. Loaded as a
plugin by tests/conftest.py for its fixtures (``tls_dir``, ``live_webhook``)."""

from __future__ import annotations

import copy
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kvgate.admission.answer import WEBHOOK_PATH
from kvgate.kube.tls import make_ca, make_serving_cert, write_tls_dir
from kvgate.webhook.app import serving

SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"
# The README's sample: the same spec with its weights on a claim (spec.model.source).
SAMPLE_WITH_WEIGHTS = SAMPLE.with_name("llama-8b-pvc.yaml")
DELETE = object()


def sample() -> dict[str, Any]:
    """The shipped safe sample: Llama-3.1-8B, 131,072 tokens, 80 GiB GPUs."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    return doc


def sample_with_weights() -> dict[str, Any]:
    """The sample with spec.model.source set: nothing in it draws a warning."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE_WITH_WEIGHTS.read_text())
    return doc


def mutated(changes: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sample with dotted-path changes applied: {"spec.decode.replicas": -1}."""
    doc = copy.deepcopy(base if base is not None else sample())
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


def review(
    obj: Any,
    *,
    operation: str = "CREATE",
    old: Any = None,
    uid: str = "0c3e9b6c-4a7e-4a38-9f44-1f7a2b1d9e01",
    resource: str = "modeldeployments",
) -> dict[str, Any]:
    """An AdmissionReview v1 request as the API server sends it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "kvgate.io", "version": "v1alpha1", "kind": "ModelDeployment"},
            "resource": {"group": "kvgate.io", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "kvgate.io", "version": "v1alpha1", "kind": "ModelDeployment"},
            "name": "llama-8b",
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": None,
        },
    }


@dataclass(frozen=True)
class LiveWebhook:
    """A running webhook: the URL of the ModelDeployment handler and a client TLS context."""

    base_url: str
    url: str
    client_ssl: ssl.SSLContext


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("webhook-tls")
    ca = make_ca()
    write_tls_dir(directory, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    return directory


def live(base_url: str, tls_dir: Path) -> LiveWebhook:
    """How a test reaches the webhook at `base_url` (``https://127.0.0.1:<port>``): its URLs and
    a client trusting the CA in `tls_dir`."""
    client_ssl = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    return LiveWebhook(base_url=base_url, url=base_url + WEBHOOK_PATH, client_ssl=client_ssl)


@pytest.fixture
async def live_webhook(tls_dir: Path) -> AsyncIterator[LiveWebhook]:
    """The webhook's HTTPS server (as `kvgate webhook` runs it) on 127.0.0.1."""
    async with serving(tls_dir) as server:
        yield live(server.url, tls_dir)


async def post(
    webhook: LiveWebhook, body: Any, *, url: str | None = None, raw: bool = False
) -> tuple[int, Any]:
    data = body if raw else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url or webhook.url,
            data=data,
            headers={"Content-Type": "application/json"},
            ssl=webhook.client_ssl,
        ) as response,
    ):
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text
