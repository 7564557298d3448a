"""``pip install`` of the repository gives the ``kvgate`` command and the ``kubectl-kvgate``
plugin (kubectl runs ``kubectl-<name>`` from PATH), and ``--version`` says the installed version.

The install goes into a temporary directory (``pip install --target``, no dependencies, the
build backend already in this venv), never into the venv itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from kvgate.cmd.cli import OPERATOR_EXTRA, main

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"kvgate": "kvgate.cmd.cli:main", "kubectl-kvgate": "kvgate.cmd.cli:kubectl_plugin"}
INSTALL_SECONDS = 300
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_project_declares_both_scripts_and_they_resolve() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert declared == SCRIPTS
    for target in declared.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_version_prints_the_installed_distributions_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvgate {importlib.metadata.version('kvgate')}"


def test_the_kubectl_plugin_names_itself_as_kubectl_calls_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvgate.cmd.cli import kubectl_plugin

    monkeypatch.setattr(sys, "argv", ["kubectl-kvgate", "explain", "--help"])
    assert kubectl_plugin() == 0
    assert capsys.readouterr().out.startswith("usage: kubectl kvgate explain")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's Python packages installed with pip into a temporary target."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "tests", "bench", "controlplane")
    for folder, package in (
        ("operator", "kvgate"),
        ("engine", "kvgate_engine"),
        ("e2e", "kvgate_e2e"),
    ):
        shutil.copytree(ROOT / folder / package, source / folder / package, ignore=ignore)
    target = tmp_path_factory.mktemp("target")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-compile",
            "--disable-pip-version-check",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        timeout=INSTALL_SECONDS,
        capture_output=True,
    )
    return target


def test_pip_install_of_the_repository_gives_kvgate_and_kubectl_kvgate(installed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    for script in SCRIPTS:
        path = installed / "bin" / script
        assert path.is_file() and os.access(path, os.X_OK), sorted(
            p.name for p in (installed / "bin").iterdir()
        )
        done = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, env=env, timeout=60
        )
        assert (done.returncode, done.stdout.strip()) == (0, f"kvgate {VERSION}"), done.stderr
    (distribution,) = importlib.metadata.distributions(path=[str(installed)])
    points = {p.name: p.value for p in distribution.entry_points if p.group == "console_scripts"}
    assert points == SCRIPTS


def test_the_install_holds_no_e2e_harness_and_the_operator_dependencies_are_an_extra(
    installed: Path,
) -> None:
    assert sorted(p.name for p in installed.iterdir() if p.name.startswith("kvgate")) == [
        "kvgate",
        f"kvgate-{VERSION}.dist-info",
        "kvgate_engine",
    ]
    (distribution,) = importlib.metadata.distributions(path=[str(installed)])
    plain = {r.split(">")[0].split("=")[0] for r in distribution.requires or [] if ";" not in r}
    extra = {r.split(">")[0] for r in distribution.requires or [] if 'extra == "operator"' in r}
    assert plain.isdisjoint(OPERATOR_EXTRA)
    assert extra == set(OPERATOR_EXTRA)


# Runs the CLI as a plain `pip install` has it: the operator extra's modules cannot be imported.
WITHOUT_OPERATOR_EXTRA = """
import sys
blocked = set(sys.argv[1].split(","))
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
from kvgate.cmd.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _without_operator_extra(installed: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_OPERATOR_EXTRA, ",".join(sorted(OPERATOR_EXTRA)), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(installed), "KUBECONFIG": "/nonexistent"},
        timeout=120,
    )


def test_the_command_line_runs_without_the_operator_extra(installed: Path) -> None:
    sample = str(ROOT / "crds" / "samples" / "llama-8b.yaml")
    for argv, code in (
        (("validate", sample), 0),
        (("plan", "-f", sample), 0),
        (("crd",), 0),
        (("explain", "llama-8b"), 2),  # no cluster here: a cluster error, not a missing module
        (("history", "llama-8b"), 2),
    ):
        done = _without_operator_extra(installed, *argv)
        assert done.returncode == code, (argv, done.stderr[-2000:])
        assert "operator's dependencies" not in done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv", [("operator",), ("webhook", "--tls-dir", "/nonexistent")])
def test_a_server_command_without_the_operator_extra_names_it_and_exits_2(
    installed: Path, argv: tuple[str, ...]
) -> None:
    command = argv[0]
    done = _without_operator_extra(installed, *argv)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"kvgate {command}: needs the operator's dependencies (no module named" in done.stderr
    assert "pip install 'kvgate[operator]'" in done.stderr
