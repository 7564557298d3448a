"""What a real node is made of, and where each comes from (all cached, none installed):

* the kubelet: ``e2e/controlplane/build-kubelet.sh`` (Kubernetes v1.37.2's modules, the control
  plane's replaces), linked at ``e2e/.build/kubelet``;
* containerd 1.6.20 and runc 1.1.5: Debian's packages unpacked by ``make container-runtime``;
* the CNI plugins bridge, host-local, portmap and loopback: Debian's containernetworking-plugins
  1.1.1 unpacked by ``make cni-plugins``;
* the shipped image: ``make image``'s ``dist/kvgate-operator-<version>.oci.tar``;
* the sandbox image: ``pause.c`` built static by gcc and packed by the image build's own layer
  and archive functions, cached by the content of its inputs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kvgate_e2e.realnode.config import SANDBOX_IMAGE

REPO = Path(__file__).resolve().parents[3]
KUBELET_LINK = REPO / "e2e" / ".build" / "kubelet" / "kubelet"
IMAGE_BUILD = REPO / "operator" / "image" / "build.py"
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
RUNTIME_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc")
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")


def kvgate_cache() -> Path:
    """The Makefile's ``$(KVGATE_CACHE)``."""
    named = os.environ.get("KVGATE_CACHE")
    return Path(named) if named else Path.home() / ".cache" / "kvgate"


@dataclass(frozen=True)
class NodeArtifacts:
    kubelet: Path
    runtime_bin: Path  # containerd, its runc shim, ctr, runc
    cni_bin: Path
    image_archive: Path  # the shipped image


def image_archive() -> Path | None:
    """``make image``'s archive for this checkout's version."""
    found = sorted((REPO / "dist").glob("kvgate-operator-*.oci.tar"))
    version = _project_version()
    for archive in found:
        if archive.name == f"kvgate-operator-{version}.oci.tar":
            return archive
    return None


def _project_version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise ValueError("pyproject.toml has no version")


def missing() -> list[str]:
    """What a real node lacks on this machine, each with the command that provides it."""
    out: list[str] = []
    if os.geteuid() != 0:
        out.append("root (a kubelet, containerd and cgroups)")
    if not os.access(KUBELET_LINK, os.X_OK):
        out.append(f"the kubelet ({KUBELET_LINK}: e2e/controlplane/build-kubelet.sh)")
    runtime = kvgate_cache() / "container-runtime" / "bin"
    if not all(os.access(runtime / t, os.X_OK) for t in RUNTIME_TOOLS):
        out.append(f"containerd and runc ({runtime}: make container-runtime)")
    cni = kvgate_cache() / "cni-plugins" / "bin"
    if not all(os.access(cni / p, os.X_OK) for p in CNI_PLUGINS):
        out.append(f"the CNI plugins ({cni}: make cni-plugins)")
    if image_archive() is None:
        out.append(
            f"the shipped image (dist/kvgate-operator-{_project_version()}.oci.tar: make image)"
        )
    if shutil.which("gcc") is None:
        out.append("gcc (the sandbox image's pause: make system-packages)")
    return out


def require() -> NodeArtifacts:
    lacking = missing()
    archive = image_archive()
    if lacking or archive is None:
        raise FileNotFoundError("a real node needs " + "; ".join(lacking))
    return NodeArtifacts(
        kubelet=KUBELET_LINK.resolve(),
        runtime_bin=kvgate_cache() / "container-runtime" / "bin",
        cni_bin=kvgate_cache() / "cni-plugins" / "bin",
        image_archive=archive,
    )


def image_ref(archive: Path) -> str:
    """The name an OCI archive gives its image (``io.containerd.image.name``)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive}: no index.json")
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["io.containerd.image.name"])


def _image_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvgate_image_build", IMAGE_BUILD)
    if spec is None or spec.loader is None:
        raise ImportError(IMAGE_BUILD)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def pause_archive() -> Path:
    """The sandbox image's OCI archive, built on first use and cached by the content of its
    source, gcc's version and the archive functions."""
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(
        PAUSE_SOURCE.read_bytes() + gcc.encode() + IMAGE_BUILD.read_bytes() + SANDBOX_IMAGE.encode()
    ).hexdigest()[:16]
    cached = kvgate_cache() / "realnode" / f"pause-{key}.oci.tar"
    if cached.is_file():
        return cached
    build = _image_build()
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvgate-pause-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-o", str(root / "pause"), str(PAUSE_SOURCE)],
            check=True,
        )
        layer_tar = build.layer_tar(root, ["pause"], 0)
        layer = build.Layer(layer_tar, build.gzip_bytes(layer_tar), "pause, gcc -static")
        data, _digest = build.oci_archive(
            [layer], 0, SANDBOX_IMAGE, "1", {"Entrypoint": ["/pause"], "User": "65535:65535"}
        )
        tmp_file = cached.with_name(cached.name + f".tmp-{os.getpid()}")
        tmp_file.write_bytes(data)
        tmp_file.replace(cached)
    return cached
