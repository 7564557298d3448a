"""Where the e2e control-plane binaries are, as built by ``e2e/controlplane/build.sh``.

``build.sh`` writes ``e2e/.build/<key>/{kvgate-k8s,helm}`` and points ``e2e/.build/current`` at the
newest build. ``KVGATE_E2E_BIN_DIR`` overrides the directory (e.g. a CI cache restored elsewhere).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = E2E_DIR / "controlplane" / "build.sh"
DEFAULT_BIN_DIR = E2E_DIR / ".build" / "current"
BIN_DIR_ENV = "KVGATE_E2E_BIN_DIR"


@dataclass(frozen=True)
class Binaries:
    """The multi-call control-plane binary and helm."""

    k8s: Path
    helm: Path


def bin_dir() -> Path:
    return Path(os.environ.get(BIN_DIR_ENV) or DEFAULT_BIN_DIR)


def find_binaries() -> Binaries | None:
    """The built binaries, or None if they are not (completely) built."""
    d = bin_dir()
    found = Binaries(k8s=d / "kvgate-k8s", helm=d / "helm")
    if all(p.is_file() and os.access(p, os.X_OK) for p in (found.k8s, found.helm)):
        return found
    return None


def missing_binaries_reason() -> str:
    """A message saying what is missing and how to build it."""
    return (
        f"e2e control-plane binaries not found in {bin_dir()} (need kvgate-k8s and helm); "
        f"build them with `{BUILD_SCRIPT}` (first build ~15-40 min, then cached) "
        f"or point {BIN_DIR_ENV} at a directory holding them"
    )


def require_binaries() -> Binaries:
    found = find_binaries()
    if found is None:
        raise FileNotFoundError(missing_binaries_reason())
    return found
