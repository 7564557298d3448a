"""The ValidatingWebhookConfiguration that sends ModelDeployment writes to the webhook.

One builder for the Helm chart's template, the e2e tier and the demo, so all three register the
webhook the same way: either a Service reference (in-cluster) or a URL (an operator running
outside the cluster), always with the CA bundle that signed the serving certificate.
"""

from __future__ import annotations

import base64
from typing import Any

from kvgate.admission.answer import HANDLER_ID, WEBHOOK_PATH
from kvgate.api.models import GROUP, PLURAL, VERSION

CONFIGURATION_NAME = "kvgate.io"
WEBHOOK_NAME = f"{HANDLER_ID}.{GROUP}"
TIMEOUT_SECONDS = 10


def validating_webhook_configuration(
    *,
    ca_bundle: bytes,
    url: str | None = None,
    service_name: str | None = None,
    service_namespace: str | None = None,
    service_port: int = 443,
    name: str = CONFIGURATION_NAME,
) -> dict[str, Any]:
    """The manifest, for a Service (`service_name`, `service_namespace`) or a base `url`
    (``https://127.0.0.1:9443``; the handler path is appended). `ca_bundle` is PEM."""
    if (url is None) == (service_name is None):
        raise ValueError("pass exactly one of url= or service_name= (with service_namespace=)")
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if url is not None:
        client_config["url"] = url.rstrip("/") + WEBHOOK_PATH
    else:
        if not service_namespace:
            raise ValueError("service_namespace= is required with service_name=")
        client_config["service"] = {
            "name": service_name,
            "namespace": service_namespace,
            "port": service_port,
            "path": WEBHOOK_PATH,
        }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                # Fail closed: an unreachable webhook must not let an unchecked spec through.
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "timeoutSeconds": TIMEOUT_SECONDS,
                "rules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "resources": [PLURAL],
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "Namespaced",
                    }
                ],
                "clientConfig": client_config,
            }
        ],
    }
