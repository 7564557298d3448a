"""The webhook served from inside `kvgate operator` (without --no-webhook: tests, development).

The same lean server as `kvgate webhook` (`kvgate.webhook.app`), started and stopped by kopf
through its admission-server slot; kopf's own admission machinery is not in the request path
(this object ignores the request function kopf passes). kopf does not manage the
ValidatingWebhookConfiguration: the chart or `kvgate.admission.registration` ships it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import kopf

from kvgate.admission.answer import WEBHOOK_PATH
from kvgate.admission.policy import ClusterPolicy
from kvgate.webhook.app import AdmissionServer
from kvgate.webhook.certificates import ReloadingCertificate


class OperatorWebhookServer:
    """kopf's `settings.admission.server`: serves until kopf cancels it (operator exit)."""

    def __init__(self, *, tls_dir: str | Path, port: int, addr: str, policy: ClusterPolicy) -> None:
        # Missing certificate files fail the operator's start-up, naming the path.
        self.certificate = ReloadingCertificate(tls_dir)
        self.port = port
        self.addr = addr
        self.policy = policy

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        server = AdmissionServer(
            certificate=self.certificate, policy=self.policy, host=self.addr, port=self.port
        )
        await server.start()
        try:
            yield kopf.WebhookClientConfig(url=server.url + WEBHOOK_PATH)
            await asyncio.Event().wait()
        finally:
            await server.stop()
