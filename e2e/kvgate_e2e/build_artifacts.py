"""Where the e2e control-plane binaries are, as built by ``e2e/controlplane/build.sh``.

``build.sh`` builds into a cache outside the clone, ``<cache root>/<key>/{kvgate-k8s,helm}``
(``<cache root>`` = ``$KVGATE_E2E_BUILD_ROOT``, default
``${XDG_CACHE_HOME:-~/.cache}/kvgate/e2e-build``; ``<key>`` hashes the Go sources and build
flags), and points this checkout's ``e2e/.build/current`` at it. Lookup order:

1. ``KVGATE_E2E_BIN_DIR`` (e.g. a CI cache restored elsewhere);
2. ``e2e/.build/current`` when it holds both binaries;
3. the cache directory of this checkout's key (``build.sh --print-dir``), so a fresh clone finds
   a build another clone of the same sources made, before ``build.sh`` has linked it.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvgate_e2e.deadlines import BUILD_QUERY_TIMEOUT

E2E_DIR = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = E2E_DIR / "controlplane" / "build.sh"
DEFAULT_BIN_DIR = E2E_DIR / ".build" / "current"
BIN_DIR_ENV = "KVGATE_E2E_BIN_DIR"
BUILD_ROOT_ENV = "KVGATE_E2E_BUILD_ROOT"


@dataclass(frozen=True)
class Binaries:
    """The multi-call control-plane binary and helm."""

    k8s: Path
    helm: Path


def cache_root() -> Path:
    """The shared build cache (outside the clone)."""
    named = os.environ.get(BUILD_ROOT_ENV)
    if named:
        return Path(named)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kvgate" / "e2e-build"


@functools.cache
def keyed_dir() -> Path | None:
    """The cache directory for this checkout's sources (``build.sh --print-dir``), or None when
    it cannot be computed (no Go toolchain, no module cache)."""
    try:
        proc = subprocess.run(
            [str(BUILD_SCRIPT), "--print-dir"],
            capture_output=True,
            text=True,
            timeout=BUILD_QUERY_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = proc.stdout.strip().splitlines()
    return Path(out[-1]) if proc.returncode == 0 and out else None


def _complete(d: Path) -> Binaries | None:
    found = Binaries(k8s=d / "kvgate-k8s", helm=d / "helm")
    if all(p.is_file() and os.access(p, os.X_OK) for p in (found.k8s, found.helm)):
        return found
    return None


def bin_dir() -> Path:
    """The directory the binaries are (or would be) taken from."""
    named = os.environ.get(BIN_DIR_ENV)
    if named:
        return Path(named)
    if _complete(DEFAULT_BIN_DIR) is not None:
        return DEFAULT_BIN_DIR
    keyed = keyed_dir()
    if keyed is not None and _complete(keyed) is not None:
        return keyed
    return DEFAULT_BIN_DIR


def find_binaries() -> Binaries | None:
    """The built binaries, or None if they are not (completely) built."""
    return _complete(bin_dir())


def missing_binaries_reason() -> str:
    """A message saying what is missing and how to build it."""
    return (
        f"e2e control-plane binaries not found in {bin_dir()} (need kvgate-k8s and helm); "
        f"build them with `{BUILD_SCRIPT}` (first build ~15-40 min into {cache_root()}, then "
        f"cached and shared by every clone) or point {BIN_DIR_ENV} at a directory holding them"
    )


def e2e_required_by(env: Mapping[str, str]) -> str | None:
    """Why a missing build must fail the e2e tier rather than skip it (None: it may skip): under
    CI (``CI`` set, as CI services and ``.ci/run`` do) and in ``make test``/``make e2e``
    (``KVGATE_REQUIRE_E2E=1``), a green run must mean the tier ran."""
    if env.get("CI"):
        return f"CI={env['CI']!r} is set"
    if env.get("KVGATE_REQUIRE_E2E") == "1":
        return "KVGATE_REQUIRE_E2E=1 is set"
    return None


def require_binaries() -> Binaries:
    found = find_binaries()
    if found is None:
        raise FileNotFoundError(missing_binaries_reason())
    return found
