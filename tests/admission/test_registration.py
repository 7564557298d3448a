"""The ValidatingWebhookConfiguration sends ModelDeployment writes to the pinned handler path."""

from __future__ import annotations

import base64

import pytest
from kvgate.admission.registration import validating_webhook_configuration
from kvgate.kube.tls import make_ca

CA_PEM = make_ca().cert_pem


def test_service_registration_points_at_the_handler_path_with_the_ca() -> None:
    manifest = validating_webhook_configuration(
        ca_bundle=CA_PEM, service_name="kvgate-webhook", service_namespace="kvgate-system"
    )
    [webhook] = manifest["webhooks"]
    assert webhook["clientConfig"]["service"] == {
        "name": "kvgate-webhook",
        "namespace": "kvgate-system",
        "port": 443,
        "path": "/validate-modeldeployment",
    }
    assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == CA_PEM
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert webhook["rules"][0]["resources"] == ["modeldeployments"]


def test_url_registration_appends_the_handler_path() -> None:
    manifest = validating_webhook_configuration(ca_bundle=CA_PEM, url="https://127.0.0.1:9443/")
    url = manifest["webhooks"][0]["clientConfig"]["url"]
    assert url == "https://127.0.0.1:9443/validate-modeldeployment"


def test_registration_needs_exactly_one_target() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        validating_webhook_configuration(ca_bundle=CA_PEM)
