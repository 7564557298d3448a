"""docs/quickstart.md tells the truth: the files, anchors, values and commands it names exist,
its values file installs the chart, its claim is the one the sample mounts, the sample passes
admission, the refusal it shows is the one kvgate prints, and `make image` tags the image with
the chart's appVersion."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_runner import Helm, strict_documents
from kvgate.admission.checks import check_document
from kvgate.cmd import cli

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "quickstart.md"
SAMPLE = ROOT / "crds" / "samples" / "llama-8b-pvc.yaml"
CHART = ROOT / "charts" / "kvgate"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _yaml_blocks() -> list[dict[str, Any]]:
    return [yaml.safe_load(block) for block in _blocks("yaml")]


def test_every_link_of_the_quick_start_names_a_file_and_heading_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]+))?\)", DOC.read_text())
    assert links
    for target, anchor in links:
        path = (DOC.parent / target).resolve()
        assert path.exists(), f"docs/quickstart.md links {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
            anchors = {_anchor(h) for h in headings}
            assert anchor in anchors, f"{target} has no heading #{anchor}"


def test_the_files_and_tests_the_quick_start_names_exist() -> None:
    text = DOC.read_text()
    for name in re.findall(r"`((?:e2e/tests|tests/chart)/[\w/]+\.py)`", text):
        assert (ROOT / name).is_file(), name
    for name in re.findall(r"(crds/samples/[\w.-]+\.yaml)", text):
        assert (ROOT / name).is_file(), name


def test_the_first_install_values_install_the_chart(helm: Helm, tmp_path: Path) -> None:
    values = _yaml_blocks()[0]
    assert {"image", "gpusPerNode", "engineVersionFloor"} <= set(values)
    file = tmp_path / "my-values.yaml"
    file.write_text(yaml.safe_dump(values))
    result = helm.run(
        "template", "kvgate", str(CHART), "--namespace", "kvgate-system", "-f", str(file)
    )
    assert result.returncode == 0, result.stderr
    images = {
        c["image"]
        for doc in strict_documents(result.stdout)
        if doc.get("kind") == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert f"{values['image']['repository']}:{app_version}" in images


def test_the_claim_of_the_quick_start_is_the_one_the_sample_mounts() -> None:
    claim = next(b for b in _yaml_blocks() if b.get("kind") == "PersistentVolumeClaim")
    sample = yaml.safe_load(SAMPLE.read_text())
    source = sample["spec"]["model"]["source"]["persistentVolumeClaim"]
    assert source["claimName"] == claim["metadata"]["name"]
    assert "ReadOnlyMany" in claim["spec"]["accessModes"]
    assert sample["spec"]["model"]["path"].startswith("/models/")


def test_the_sample_with_weights_on_a_claim_passes_admission() -> None:
    result = check_document(yaml.safe_load(SAMPLE.read_text()))
    assert result.allowed, result.message


def test_the_refusal_the_quick_start_shows_is_the_one_kvgate_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "small.yaml"
    small.write_text(SAMPLE.read_text().replace("gpuMemoryGiB: 80", "gpuMemoryGiB: 24"))
    assert cli.main(["validate", str(small)]) == 1
    printed = capsys.readouterr().out.splitlines()
    found = re.search(r"```\n(checked against .*?)```", DOC.read_text(), flags=re.S)
    assert found is not None, "the quick start shows no refusal"
    shown = found.group(1).strip().splitlines()
    assert shown[:2] == printed[:2]  # the floor it checked against, then the verdict
    assert shown[2] in printed


def test_the_commands_the_quick_start_runs_are_kvgates() -> None:
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert subcommands is not None
    for command in re.findall(r"kubectl kvgate (\w[\w-]*)", DOC.read_text()):
        if command != "--help":
            assert command in subcommands, command
    for command in re.findall(r"^kvgate (\w[\w-]*)", DOC.read_text(), flags=re.M):
        assert command in subcommands, command


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_image_names_the_image_with_the_charts_app_version() -> None:
    """`make image` runs operator/image/build.py, which names the archive's image
    IMAGE:<pyproject version>; tests/image/test_dockerfile.py holds that version to the chart's
    appVersion, the tag the chart deploys by default."""
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    printed = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "-n",
            "image",
            "IMAGE=registry.example.com/kvgate/kvgate-operator",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "operator/image/build.py" in printed
    assert "--image registry.example.com/kvgate/kvgate-operator" in printed
    assert f'version = "{app_version}"' in (ROOT / "pyproject.toml").read_text()


def shell_blocks(text: str) -> str:
    """The ```sh blocks of a Markdown text, continuation lines joined, comments dropped."""
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", text, flags=re.S))
    joined = re.sub(r"\\\n\s*", "", blocks)
    return "\n".join(line.split("#", 1)[0].strip() for line in joined.splitlines())


def test_the_readmes_quick_start_builds_pushes_and_installs_as_the_quick_start_does() -> None:
    """A newcomer following either gets the same image into the same registry and installs the
    chart with that repository (never the default one, which no registry holds)."""
    readme = shell_blocks((ROOT / "README.md").read_text())
    guide = shell_blocks(DOC.read_text())
    image_repo = "registry.example.com/kvgate/kvgate-operator"
    for text in (readme, guide):
        assert f"make image IMAGE={image_repo}" in text
        assert "skopeo copy oci-archive:dist/kvgate-operator-" in text
    make_line = next(line for line in readme.splitlines() if line.startswith("make image"))
    push_line = next(line for line in readme.splitlines() if line.startswith("skopeo copy"))
    assert make_line in guide.splitlines() and push_line in guide.splitlines()
    install = next(line for line in readme.splitlines() if line.startswith("helm install"))
    assert f"--set image.repository={image_repo}" in install
    values = yaml.safe_load(re.search(r"```yaml\n(image:.*?)```", DOC.read_text(), re.S).group(1))  # type: ignore[union-attr]
    assert values["image"]["repository"] == image_repo
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None and f"kvgate-operator-{version.group(1)}.oci.tar" in push_line


def test_the_readmes_sample_loads_weights_and_is_the_quick_starts() -> None:
    """The first ModelDeployment a newcomer meets sets spec.model.source: one without it is
    admitted with a warning and never starts an engine on a stock SGLang image."""
    readme = (ROOT / "README.md").read_text()
    samples = re.findall(r"crds/samples/[\w.-]+\.yaml", readme)
    assert samples, "the README names no sample"
    assert samples[0] == "crds/samples/llama-8b-pvc.yaml", samples
    commands = shell_blocks(readme).splitlines()
    assert "kvgate validate crds/samples/llama-8b-pvc.yaml" in commands
    assert "kubectl apply -f crds/samples/llama-8b-pvc.yaml" in commands
    guide = shell_blocks(DOC.read_text()).splitlines()
    assert "kvgate validate crds/samples/llama-8b-pvc.yaml" in guide
    first = yaml.safe_load((ROOT / samples[0]).read_text())
    assert first["spec"]["model"].get("source"), f"{samples[0]} sets no spec.model.source"
    result = check_document(first)
    assert result.allowed, result.message
    assert not [w for w in result.warnings if w.field.startswith("spec.model")], result.warnings
    shown = yaml.safe_load(
        re.search(r"## A ModelDeployment\n.*?```yaml\n(.*?)```", readme, re.S).group(1)
    )  # type: ignore[union-attr]
    assert shown["spec"]["model"]["source"] == first["spec"]["model"]["source"]
    assert shown["spec"]["model"]["path"] == first["spec"]["model"]["path"]
