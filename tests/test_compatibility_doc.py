"""docs/compatibility.md states the versions kvgate runs against; each claim is read back from
the file that decides it, so a version bump that forgets the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from kvgate.api.models import DEFAULT_ROUTER_IMAGE

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "compatibility.md").read_text()


def row(component: str) -> str:
    """The table row whose first cell is ``component``."""
    for line in PAGE.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells and cells[0] == component:
            return line
    raise AssertionError(f"docs/compatibility.md has no row for {component!r}")


def assignment(path: str, name: str) -> str:
    """The default of ``NAME="${ENV:-default}"`` or ``NAME ?= default`` in a build file."""
    text = (REPO / path).read_text()
    found = re.search(rf'^{name}="\$\{{\w+:-([^}}]+)\}}"|^{name} \?= (.+)$', text, re.M)
    assert found, f"{path} sets no {name}"
    return (found.group(1) or found.group(2)).strip()


def test_the_kubernetes_row_names_the_charts_floor_and_the_version_the_e2e_world_builds() -> None:
    chart = yaml.safe_load((REPO / "charts/kvgate/Chart.yaml").read_text())
    line = row("Kubernetes")
    assert f"`kubeVersion: {chart['kubeVersion']}`" in line
    assert assignment("e2e/controlplane/build.sh", "K8S_GIT_VERSION") in line


def test_the_sglang_row_names_every_release_the_conformance_tier_parses_and_the_real_ones() -> None:
    conformance = (REPO / "tests/conformance/test_sglang_argv.py").read_text()
    supported = re.search(r"^SUPPORTED_VERSIONS = \(([^)]*)\)", conformance, re.M)
    assert supported
    versions = sorted(
        re.findall(r'"([0-9.]+)"', supported.group(1)), key=lambda v: [int(x) for x in v.split(".")]
    )
    line = row("SGLang (engine image)")
    assert f"{versions[0]} to {versions[-1]}" in line
    assert ", ".join(versions[:-1]) + f", {versions[-1]}" in line
    for real in assignment("Makefile", "REAL_ENGINE_VERSIONS").split():
        assert real in line
    values = yaml.safe_load((REPO / "charts/kvgate/values.yaml").read_text())
    assert f"defaults to {values['engineVersionFloor']}" in line


def test_the_router_row_names_the_default_router_image() -> None:
    version = DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[1]
    assert DEFAULT_ROUTER_IMAGE in row("smg (router image)")
    pinned = re.search(r'"smg==([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert pinned and pinned.group(1) == version


def test_the_go_built_rows_name_the_versions_their_build_scripts_default_to() -> None:
    assert assignment("e2e/controlplane/build.sh", "HELM_VERSION") in row("Helm")
    assert assignment("e2e/prometheus-adapter/build.sh", "VERSION") in row("prometheus-adapter")
    module = assignment("e2e/prometheus/build.sh", "VERSION")  # v0.316.0 is Prometheus 3.16.0
    major_minor = module.removeprefix("v0.")[:-2]
    release = f"{int(major_minor) // 100}.{int(major_minor) % 100}.{module.rsplit('.', 1)[1]}"
    assert f"Prometheus {release} (Go module {module})" in row("Prometheus")
    assert assignment("e2e/controlplane/build-lws.sh", "VERSION") in row("LeaderWorkerSet")


def test_the_python_row_names_the_locked_operator_dependencies() -> None:
    lock = (REPO / "operator/image/requirements.lock").read_text()
    line = row("Python (CLI and operator)")
    for package in ("kopf", "kubernetes"):
        pin = re.search(rf"^{package}==([0-9.]+)", lock, re.M)
        assert pin and f"{package} {pin.group(1)}" in line
