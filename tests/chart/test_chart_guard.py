"""The chart gives the operator its own image as the engine pods' guard image
(KVGATE_GUARD_IMAGE), however the image is pinned."""

from __future__ import annotations

import pytest
import yaml
from helm_runner import CHART, Helm

ENV = "KVGATE_GUARD_IMAGE"
APIS = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)
DIGEST = "sha256:" + "ab" * 32
APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        ((), f"ghcr.io/kvgate/kvgate-operator:{APP_VERSION}"),
        (("image.tag=9.9.9",), "ghcr.io/kvgate/kvgate-operator:9.9.9"),
        (
            ("image.repository=registry.local:5000/acme/kvgate", f"image.digest={DIGEST}"),
            f"registry.local:5000/acme/kvgate@{DIGEST}",
        ),
    ],
)
def test_the_guard_image_is_the_operators_own_image(
    helm: Helm, sets: tuple[str, ...], image: str
) -> None:
    deployment = helm.template(*sets, api_versions=APIS).controller()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[ENV] == container["image"] == image
