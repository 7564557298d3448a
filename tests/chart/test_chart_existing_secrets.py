"""The chart under GitOps: with the router key seed and the webhook's certificate in Secrets the
user already has (`routerKeySeed.existingSecret`, `webhook.existingSecret` + `webhook.caBundle`),
`helm template` renders the same bytes every time, so Argo CD (which renders with `helm
template`, where `lookup` finds nothing) neither re-keys every router nor re-issues the
webhook's CA on every sync. Without them the chart generates both, which is what the first test
shows differs between two renders."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography import x509
from helm_runner import Helm, Rendered
from kvgate.kube.tls import CA_FILE, CERT_FILE, KEY_FILE, make_ca, make_serving_cert
from kvgate.webhook.certificates import ReloadingCertificate

NAMESPACE = "kvgate-system"
SEED_SECRET = "platform-router-seed"
TLS_SECRET = "platform-webhook-tls"
CERT_MANAGER = ("cert-manager.io/v1/Certificate", "cert-manager.io/v1/Issuer")
WEBHOOK_DNS = f"kvgate-webhook.{NAMESPACE}.svc"


@pytest.fixture(scope="module")
def own_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the user's kubernetes.io/tls Secret holds, as the kubelet mounts it: tls.crt,
    tls.key and ca.crt (the CA they also give as webhook.caBundle)."""
    directory = tmp_path_factory.mktemp("own-webhook-tls")
    ca = make_ca("platform-ca")
    serving = make_serving_cert(ca, [WEBHOOK_DNS], [])
    (directory / CERT_FILE).write_bytes(serving.cert_pem)
    (directory / KEY_FILE).write_bytes(serving.key_pem)
    (directory / CA_FILE).write_bytes(ca.cert_pem)
    return directory


def _existing(own_tls: Path) -> dict[str, tuple[str, ...]]:
    return {
        "sets": (
            f"routerKeySeed.existingSecret={SEED_SECRET}",
            "routerKeySeed.existingSecretKey=token",
            f"webhook.existingSecret={TLS_SECRET}",
        ),
        "files": (f"webhook.caBundle={own_tls / CA_FILE}",),
    }


def _render_twice(helm: Helm, *sets: str, **kwargs: tuple[str, ...]) -> tuple[str, str]:
    first, second = (helm.template_result(*sets, **kwargs) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    return first.stdout, second.stdout


def test_without_existing_secrets_each_render_generates_a_new_seed_and_ca(helm: Helm) -> None:
    first, second = _render_twice(helm)
    assert first != second


def test_helm_template_twice_with_existing_secrets_gives_identical_output(
    helm: Helm, own_tls: Path
) -> None:
    existing = _existing(own_tls)
    first, second = _render_twice(helm, *existing["sets"], files=existing["files"])
    assert first == second


def test_cert_manager_and_an_existing_seed_also_render_identically(helm: Helm) -> None:
    sets = ("webhook.certManager.enabled=true", f"routerKeySeed.existingSecret={SEED_SECRET}")
    first, second = _render_twice(helm, *sets, api_versions=CERT_MANAGER)
    assert first == second


@pytest.fixture(scope="module")
def rendered(helm: Helm, own_tls: Path) -> Rendered:
    existing = _existing(own_tls)
    return helm.template(*existing["sets"], files=existing["files"])


def test_an_existing_seed_secret_reaches_the_operator_and_the_chart_renders_none(
    rendered: Rendered,
) -> None:
    (container,) = rendered.controller()["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["KVGATE_ROUTER_KEY_SEED"]["valueFrom"]["secretKeyRef"] == {
        "name": SEED_SECRET,
        "key": "token",
    }
    assert rendered.all("Secret") == []


def test_an_existing_tls_secret_is_what_the_webhook_serves_and_its_ca_what_the_api_trusts(
    rendered: Rendered, own_tls: Path
) -> None:
    webhook = rendered.webhook()
    pod = webhook["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-tls"]
    assert volumes["webhook-tls"]["secret"]["secretName"] == TLS_SECRET
    assert f"--tls-dir={mount['mountPath']}" in container["args"]
    # `kvgate webhook` serves tls.crt/tls.key from that directory (and reloads them when the
    # user's tooling renews the Secret): the Secret's files load as they are.
    ReloadingCertificate(own_tls)
    # The API server trusts exactly the CA given as webhook.caBundle, which signed tls.crt.
    [hook] = rendered.one("ValidatingWebhookConfiguration")["webhooks"]
    ca_bundle = base64.b64decode(hook["clientConfig"]["caBundle"])
    assert ca_bundle == (own_tls / CA_FILE).read_bytes()
    ca = x509.load_pem_x509_certificate(ca_bundle)
    serving = x509.load_pem_x509_certificate((own_tls / CERT_FILE).read_bytes())
    assert serving.issuer == ca.subject
    # Nothing generated: no certificate of the chart's, no checksum that would change per render.
    assert rendered.all("Certificate") == [] and rendered.all("Issuer") == []
    annotations = webhook["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/webhook-tls" not in annotations


def test_a_base64_ca_bundle_as_a_secret_prints_it_is_taken_too(helm: Helm, own_tls: Path) -> None:
    encoded = base64.b64encode((own_tls / CA_FILE).read_bytes()).decode()
    rendered = helm.template(f"webhook.existingSecret={TLS_SECRET}", f"webhook.caBundle={encoded}")
    [hook] = rendered.one("ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == encoded


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            (f"webhook.existingSecret={TLS_SECRET}",),
            f"webhook.existingSecret={TLS_SECRET} needs webhook.caBundle",
        ),
        (
            (f"webhook.existingSecret={TLS_SECRET}", "webhook.caBundle=not-a-certificate"),
            "webhook.caBundle is not a PEM certificate",
        ),
        (
            ("webhook.caBundle=-----BEGIN CERTIFICATE-----",),
            "webhook.caBundle is used only with webhook.existingSecret",
        ),
        (
            (
                f"webhook.existingSecret={TLS_SECRET}",
                "webhook.caBundle=-----BEGIN CERTIFICATE-----",
                "webhook.certManager.enabled=true",
            ),
            "webhook.existingSecret and webhook.certManager.enabled are exclusive",
        ),
    ],
    ids=["no-ca-bundle", "not-a-certificate", "ca-bundle-alone", "with-cert-manager"],
)
def test_an_existing_webhook_secret_without_a_usable_ca_fails_with_the_way_out(
    helm: Helm, sets: tuple[str, ...], message: str
) -> None:
    result = helm.template_result(*sets, api_versions=CERT_MANAGER)
    assert result.returncode != 0, f"{sets} rendered"
    assert message in result.stderr


def test_an_empty_seed_key_fails_and_names_the_field(helm: Helm) -> None:
    result = helm.template_result(
        f"routerKeySeed.existingSecret={SEED_SECRET}", "routerKeySeed.existingSecretKey="
    )
    assert result.returncode != 0
    assert "'/routerKeySeed/existingSecretKey'" in result.stderr
