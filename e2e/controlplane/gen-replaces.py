#!/usr/bin/env python3
"""Generate (or check) the k8s.io staging `replace` block of e2e/controlplane/go.mod.

k8s.io/kubernetes requires every staging module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
resolves them with `replace k8s.io/x => ./staging/src/k8s.io/x`, which consumers ignore. A module
that imports k8s.io/kubernetes must therefore pin each staging module itself. This script reads the
list from the kubernetes module's own go.mod (via `go mod download -json`, field GoMod), so it can't
drift from upstream, and maps kubernetes vX.Y.Z to staging v0.Y.Z.

    gen-replaces.py            rewrite go.mod (require + replace block), then `go mod tidy`
    gen-replaces.py --no-tidy  rewrite go.mod only
    gen-replaces.py --check    exit 1 if go.mod's replace block differs from what would be generated

Only the Python standard library and the `go` tool are used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO_MOD = HERE / "go.mod"
MODULE_PATH = "kvgate.io/e2e/controlplane"
K8S_MODULE = "k8s.io/kubernetes"
DEFAULT_K8S_VERSION = "v1.37.2"
STAGING_PREFIX = "./staging/src/"


def go(*args: str, cwd: Path = HERE) -> str:
    proc = subprocess.run(
        ["go", *args], cwd=cwd, check=False, capture_output=True, text=True, env=os.environ.copy()
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"gen-replaces: `go {' '.join(args)}` failed ({proc.returncode})")
    return proc.stdout


def staging_version(k8s_version: str) -> str:
    m = re.fullmatch(r"v1\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?", k8s_version)
    if not m:
        raise SystemExit(f"gen-replaces: cannot map {k8s_version} to a staging version")
    return f"v0.{m.group(1)}.{m.group(2)}{m.group(3) or ''}"


def upstream_staging_modules(k8s_version: str) -> list[str]:
    """Staging module paths, read from k8s.io/kubernetes@version's own go.mod."""
    info = json.loads(go("mod", "download", "-json", f"{K8S_MODULE}@{k8s_version}", cwd=Path("/")))
    gomod = info.get("GoMod")
    if not gomod:
        raise SystemExit(f"gen-replaces: no GoMod for {K8S_MODULE}@{k8s_version}: {info}")
    parsed = json.loads(go("mod", "edit", "-json", gomod, cwd=Path("/")))
    modules = sorted(
        r["Old"]["Path"]
        for r in parsed.get("Replace") or []
        if r["New"]["Path"].startswith(STAGING_PREFIX) and r["Old"]["Path"].startswith("k8s.io/")
    )
    required_v0 = {
        r["Path"]
        for r in parsed.get("Require") or []
        if r["Path"].startswith("k8s.io/") and r["Version"] == "v0.0.0"
    }
    missing = required_v0 - set(modules)
    if missing:
        raise SystemExit(f"gen-replaces: required at v0.0.0 but not replaced upstream: {missing}")
    if not modules:
        raise SystemExit("gen-replaces: found no staging replaces upstream; format changed?")
    return modules


def expected_replaces(k8s_version: str) -> list[tuple[str, str, str]]:
    sv = staging_version(k8s_version)
    return [(m, m, sv) for m in upstream_staging_modules(k8s_version)]


def current(go_mod: Path) -> tuple[str | None, list[tuple[str, str, str]]]:
    parsed = json.loads(go("mod", "edit", "-json", str(go_mod)))
    k8s = next((r["Version"] for r in parsed.get("Require") or [] if r["Path"] == K8S_MODULE), None)
    reps = sorted(
        (r["Old"]["Path"], r["New"]["Path"], r["New"].get("Version", ""))
        for r in parsed.get("Replace") or []
    )
    return k8s, reps


def check(k8s_version: str) -> int:
    if not GO_MOD.exists():
        print(f"gen-replaces --check: {GO_MOD} does not exist", file=sys.stderr)
        return 1
    want = expected_replaces(k8s_version)
    have_k8s, have = current(GO_MOD)
    ok = True
    if have_k8s != k8s_version:
        print(f"drift: go.mod requires {K8S_MODULE} {have_k8s}, expected {k8s_version}")
        ok = False
    for old, new, ver in sorted(set(want) - set(have)):
        print(f"drift: missing   replace {old} => {new} {ver}")
        ok = False
    for old, new, ver in sorted(set(have) - set(want)):
        print(f"drift: unexpected replace {old} => {new} {ver}".rstrip())
        ok = False
    if ok:
        print(
            f"go.mod replace block is up to date ({len(want)} staging modules at "
            f"{staging_version(k8s_version)})"
        )
    return 0 if ok else 1


def generate(k8s_version: str, tidy: bool) -> int:
    if not GO_MOD.exists():
        go("mod", "init", MODULE_PATH)
    _, have = current(GO_MOD)
    edits = [f"-dropreplace={old}" for old, _, _ in have]
    want = expected_replaces(k8s_version)
    edits += [f"-replace={old}={new}@{ver}" for old, new, ver in want]
    edits.append(f"-require={K8S_MODULE}@{k8s_version}")
    go("mod", "edit", *edits)
    print(f"wrote {len(want)} replace lines ({staging_version(k8s_version)}) to {GO_MOD}")
    if tidy:
        print("running go mod tidy ...", flush=True)
        go("mod", "tidy")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="report drift; exit 1 if any")
    ap.add_argument("--no-tidy", action="store_true", help="do not run go mod tidy")
    ap.add_argument(
        "--k8s-version",
        default=os.environ.get("K8S_VERSION", DEFAULT_K8S_VERSION),
        help=f"k8s.io/kubernetes version (default {DEFAULT_K8S_VERSION})",
    )
    ns = ap.parse_args()
    if ns.check:
        return check(ns.k8s_version)
    return generate(ns.k8s_version, tidy=not ns.no_tidy)


if __name__ == "__main__":
    sys.exit(main())
