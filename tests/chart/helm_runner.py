"""Find and run the `helm` binary the e2e build produces (or the one KVGATE_HELM names)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kvgate_e2e import build_artifacts
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvgate"
# The e2e control plane's version. A helm built with plain `go install` defaults to v1.20.
KUBE_VERSION = "v1.37.2"


def find_helm() -> Path | None:
    """KVGATE_HELM, else the e2e build's helm (``kvgate_e2e.build_artifacts``: this checkout's
    build in the shared cache), else the newest helm in that cache, else PATH."""
    named = os.environ.get("KVGATE_HELM")
    if named:
        path = Path(named)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"KVGATE_HELM={named} is not an executable file")
        return path
    binaries = build_artifacts.find_binaries()
    if binaries is not None:
        return binaries.helm
    built = [
        p
        for p in build_artifacts.cache_root().glob("*/helm")
        if p.is_file() and os.access(p, os.X_OK)
    ]
    if built:
        return max(built, key=lambda p: p.stat().st_mtime)
    on_path = shutil.which("helm")
    return Path(on_path) if on_path else None


MISSING_HELM = (
    "no helm binary: build it with e2e/controlplane/build.sh (links e2e/.build/current/helm) "
    "or point KVGATE_HELM at a helm v3 binary"
)


class StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice. PyYAML (and Helm's own
    reading of a manifest) keeps the last value silently; `kubectl apply` and the API server's
    strict decoding refuse the object (``json: duplicate field``)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def strict_documents(text: str) -> list[dict[str, Any]]:
    """Every non-empty document of a multi-document YAML stream, refusing duplicate keys."""
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d]


@dataclass(frozen=True)
class Rendered:
    """The documents of one `helm template`, looked up by kind and name."""

    documents: list[dict[str, Any]]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.documents if d.get("kind") == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def component(self, kind: str, component: str) -> dict[str, Any]:
        """The one object of ``kind`` labelled app.kubernetes.io/component=<component>
        (``operator``: the controller; ``webhook``: the admission webhook)."""
        found = [
            d
            for d in self.all(kind)
            if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} of component {component}, found {len(found)}"
        return found[0]

    def controller(self) -> dict[str, Any]:
        """The controller (operator) Deployment."""
        return self.component("Deployment", "operator")

    def webhook(self) -> dict[str, Any]:
        """The admission webhook's Deployment."""
        return self.component("Deployment", "webhook")


@dataclass(frozen=True)
class Helm:
    binary: Path
    home: Path  # helm's cache/config/data folders (a pytest temporary directory)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            # Keep helm away from any real kubeconfig, cache or repository config.
            "HOME": str(self.home),
            "KUBECONFIG": "/dev/null",
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=env, timeout=60
        )

    def template_result(
        self,
        *sets: str,
        api_versions: tuple[str, ...] = (),
        chart: Path = CHART,
        files: tuple[str, ...] = (),
        kube_version: str = KUBE_VERSION,
    ) -> subprocess.CompletedProcess[str]:
        """`helm template` with ``--set`` for each of ``sets`` and ``--set-file`` for each of
        ``files`` (``key=path``)."""
        args = ["template", "kvgate", str(chart), "--namespace", "kvgate-system"]
        args += ["--kube-version", kube_version]
        for value in sets:
            args += ["--set", value]
        for file in files:
            args += ["--set-file", file]
        for api in api_versions:
            args += ["--api-versions", api]
        return self.run(*args)

    def template(
        self,
        *sets: str,
        api_versions: tuple[str, ...] = (),
        chart: Path = CHART,
        files: tuple[str, ...] = (),
    ) -> Rendered:
        """The rendered documents, read strictly (a duplicate key fails the test)."""
        result = self.template_result(*sets, api_versions=api_versions, chart=chart, files=files)
        assert result.returncode == 0, result.stderr
        return Rendered(strict_documents(result.stdout))


def render_notes(
    helm: Helm, chart_copy: Path, *sets: str, api_versions: tuple[str, ...] = ()
) -> str:
    """NOTES.txt as `helm install` prints it (wrapped in a ConfigMap: `helm template` drops it),
    rendered from a copy of the chart made at ``chart_copy``."""
    shutil.copytree(CHART, chart_copy)
    notes = chart_copy / "templates" / "NOTES.txt"
    (chart_copy / "templates" / "_notes_under_test.tpl").write_text(
        '{{- define "notes-under-test" }}' + notes.read_text() + "{{- end }}"
    )
    notes.unlink()
    (chart_copy / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\n"
        'data:\n  notes: {{ include "notes-under-test" . | toJson }}\n'
    )
    rendered = helm.template(*sets, chart=chart_copy, api_versions=api_versions)
    text: str = rendered.one("ConfigMap", "notes-under-test")["data"]["notes"]
    return text
