#!/usr/bin/env python3
"""Build the image kvgate ships, with no daemon and no registry, into an OCI archive.

    operator/image/build.py [--out DIR] [--cache DIR] [--uv UV] [--no-cache]
    operator/image/build.py lock [--uv UV]      # refresh both lock files (needs the network)

The image holds one Python environment, /opt/kvgate, with `kvgate` (operator, webhook, guard,
fetch-model and the CLI) and `kubectl-kvgate`, on a Debian bookworm root filesystem. Every input
is pinned:

- `debian.lock`: the APT sources and every Debian package of the root filesystem at one version.
  mmdebstrap installs exactly those (variant custom), so the rootfs holds nothing unlisted.
- `requirements.lock`: kvgate's runtime dependencies with their hashes (uv pip compile);
  `build-constraints.lock`: the setuptools and wheel that build kvgate's own wheel, hashed too.
- kvgate's own sources (pyproject.toml, README.md, operator/kvgate, engine/kvgate_engine).

Two builds of the same inputs give the same bytes, hence one digest: every file's mtime is the
layer's epoch (the Debian layer: the lock's `epoch`; the kvgate layer: SOURCE_DATE_EPOCH, else the
last commit's time), owners are numeric, entries are sorted, gzip carries no name and no time,
bytecode uses unchecked hashes instead of timestamps, and /dev, caches and logs are left out.

Two layers: the Debian rootfs with the kvgate user (65532), then /opt/kvgate. The first changes
only with debian.lock, so a registry keeps it across releases.

The result, `kvgate-operator-<version>.oci.tar`, is an OCI image layout in a tar (oci-layout,
index.json, blobs/sha256/...) that `ctr images import`, `skopeo copy oci-archive:...`,
`docker load` (Docker 25+) and `podman load` take. Its name inside is IMAGE:<version>
(default ghcr.io/kvgate/kvgate-operator, the chart's default repository).

Needs root (mmdebstrap's root mode and chroot), mmdebstrap (Debian) and uv; see docs/quickstart.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEBIAN_LOCK = HERE / "debian.lock"
REQUIREMENTS_LOCK = HERE / "requirements.lock"
BUILD_CONSTRAINTS_LOCK = HERE / "build-constraints.lock"
DEFAULT_IMAGE = "ghcr.io/kvgate/kvgate-operator"

# What goes into kvgate's own wheel: the Dockerfile copies exactly these too.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "operator/kvgate", "engine/kvgate_engine")
# The Debian packages the lock is made from (their dependencies join them in the lock).
DEBIAN_ROOTS = ("python3.11", "ca-certificates")
# Kept out of the Debian layer: documentation, manuals and translations (copyright files stay).
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)

UID = GID = 65532
VENV = "/opt/kvgate"

# The image's configuration. operator/Dockerfile states the same; tests/image checks they agree.
CONFIG: dict[str, object] = {
    "User": f"{UID}:{GID}",
    "Entrypoint": ["kvgate", "operator"],
    "Env": [
        f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/tmp",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
    ],
    "WorkingDir": "/tmp",
    # metrics, health (/healthz; the webhook also /readyz), admission webhook (HTTPS)
    "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}, "9443/tcp": {}},
    "Labels": {
        "org.opencontainers.image.title": "kvgate-operator",
        "org.opencontainers.image.description": (
            "Kubernetes operator that gates SGLang prefill/decode pods on live KV-pool verification"
        ),
        "org.opencontainers.image.source": "https://github.com/kvgate/kvgate",
        "org.opencontainers.image.licenses": "Apache-2.0",
    },
}

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


class BuildError(Exception):
    """A build that cannot go on; the message says what to do."""


# ---------------------------------------------------------------- the lock files


@dataclass(frozen=True)
class DebianLock:
    suite: str
    sources: tuple[str, ...]
    epoch: int
    packages: tuple[str, ...]  # name=version


def read_debian_lock(path: Path = DEBIAN_LOCK) -> DebianLock:
    suite, epoch = "", -1
    sources: list[str] = []
    packages: list[str] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, value = line.partition(" ")
        if key == "suite":
            suite = value.strip()
        elif key == "source":
            sources.append(value.strip())
        elif key == "epoch":
            epoch = int(value)
        elif key == "package" and re.fullmatch(r"[a-z0-9][a-z0-9.+-]*=\S+", value.strip()):
            packages.append(value.strip())
        else:
            raise BuildError(
                f"{path}:{number}: cannot read {raw!r}; refresh it with `make image-lock`"
            )
    if not suite or not sources or epoch < 0 or not packages:
        raise BuildError(
            f"{path}: needs suite, source, epoch and package lines; run `make image-lock`"
        )
    return DebianLock(suite, tuple(sources), epoch, tuple(packages))


def lock_pins(path: Path) -> dict[str, str]:
    """name -> version of a hashed requirements lock (every pin must carry a hash)."""
    pins: dict[str, str] = {}
    text = path.read_text()
    for block in re.split(r"\n(?=\S)", text):
        first = block.split("\\", 1)[0].strip()
        if not first or first.startswith("#"):
            continue
        name, sep, version = first.partition("==")
        if not sep or "--hash=sha256:" not in block:
            raise BuildError(f"{path}: {first!r} is not pinned with a hash; run `make image-lock`")
        pins[name.strip().lower()] = version.strip()
    return pins


# ---------------------------------------------------------------- deterministic archives


def _normalized(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    info.mtime = epoch
    info.uname = info.gname = ""
    info.pax_headers = {}
    return info


def _walk(root: Path, top: str) -> Iterator[Path]:
    """`top` (relative to root) and everything under it, sorted, parents first."""
    start = root / top
    yield start
    if start.is_dir() and not start.is_symlink():
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            here = Path(dirpath)
            for name in sorted(dirnames + filenames):
                yield here / name


def layer_tar(root: Path, tops: list[str], epoch: int, skip_under: tuple[str, ...] = ()) -> bytes:
    """An uncompressed layer of `tops` under `root`: sorted, numeric owners, mtime = epoch."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for top in tops:
            for path in _walk(root, top):
                rel = path.relative_to(root).as_posix()
                if any(rel.startswith(prefix + "/") for prefix in skip_under):
                    continue
                info = tar.gettarinfo(str(path), arcname=rel)
                _normalized(info, epoch)
                if info.isreg():
                    with path.open("rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
    return out.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return out.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def rfc3339(epoch: int) -> str:
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Layer:
    tar: bytes  # uncompressed: its digest is the config's diff_id
    blob: bytes  # gzip
    comment: str


def oci_archive(
    layers: list[Layer],
    created: int,
    ref: str,
    version: str,
    image_config: Mapping[str, object] = CONFIG,
) -> tuple[bytes, str]:
    """The OCI image layout tar and the manifest's digest (the image's digest); `image_config`
    is the runtime configuration (user, entrypoint, environment), kvgate's by default."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": rfc3339(created),
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer.tar) for layer in layers]},
        "history": [{"created": rfc3339(created), "created_by": layer.comment} for layer in layers],
    }
    config_bytes = canonical_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {
            "mediaType": MEDIA_CONFIG,
            "digest": sha256(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [
            {"mediaType": MEDIA_LAYER, "digest": sha256(layer.blob), "size": len(layer.blob)}
            for layer in layers
        ],
        "annotations": {
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.created": rfc3339(created),
        },
    }
    manifest_bytes = canonical_json(manifest)
    digest = sha256(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": version,
                },
            }
        ],
    }
    files: list[tuple[str, bytes]] = [
        ("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"})),
        ("index.json", canonical_json(index)),
    ]
    blobs = {
        sha256(b): b for b in [config_bytes, manifest_bytes, *(layer.blob for layer in layers)]
    }
    files += [(f"blobs/sha256/{d.split(':', 1)[1]}", b) for d, b in sorted(blobs.items())]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for dirname in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(dirname)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, created
            tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, created
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue(), digest


# ---------------------------------------------------------------- the build steps


def run(argv: list[str], **kwargs: object) -> None:
    print("+ " + " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]


def source_epoch() -> int:
    if "SOURCE_DATE_EPOCH" in os.environ:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%ct"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if out:
            return int(out)
    raise BuildError("no SOURCE_DATE_EPOCH and no git commit to take the kvgate layer's time from")


def source_files() -> list[Path]:
    """kvgate's sources as git sees them (tracked, or new and not ignored): never caches."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "--", *SOURCES],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        names = sorted(set(out.splitlines()))
    except (OSError, subprocess.CalledProcessError):  # a source tree without git (the Dockerfile)
        names = sorted(
            p.relative_to(REPO).as_posix()
            for top in SOURCES
            for p in ([REPO / top] if (REPO / top).is_file() else (REPO / top).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        )
    return [REPO / name for name in names if (REPO / name).is_file()]


def inputs_key(uv: Path) -> str:
    """The content hash of everything the image is made from: its cache key."""
    digest = hashlib.sha256()
    for path in [
        Path(__file__),
        DEBIAN_LOCK,
        REQUIREMENTS_LOCK,
        BUILD_CONSTRAINTS_LOCK,
        *source_files(),
    ]:
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(f"epoch={source_epoch()} uv={uv_version(uv)}".encode())
    return digest.hexdigest()[:16]


def uv_version(uv: Path) -> str:
    return subprocess.run(
        [str(uv), "--version"], check=True, capture_output=True, text=True
    ).stdout.strip()


def mmdebstrap(lock: DebianLock, rootfs: Path, debs: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError(
            "mmdebstrap is not installed: apt-get install mmdebstrap (Debian), or `make image`"
        )
    debs.mkdir(parents=True, exist_ok=True)
    argv = [
        "mmdebstrap",
        "--mode=root",
        "--variant=custom",
        "--format=directory",
        "--quiet",
        "--include=" + ",".join(lock.packages),
        *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
        # Downloaded packages are kept between builds (mmdebstrap's own recipe for an apt cache).
        "--skip=download/empty",
        "--skip=essential/unlink",
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
        lock.suite,
        str(rootfs),
        *lock.sources,
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(lock.epoch)}
    try:
        run(argv, env=env)
    except subprocess.CalledProcessError as error:
        raise BuildError(
            f"mmdebstrap failed (exit {error.returncode}) installing the "
            f"{len(lock.packages)} packages of {DEBIAN_LOCK.relative_to(REPO)}; if the mirror "
            "no longer serves a pinned version, refresh the lock with `make image-lock` and "
            "commit it"
        ) from error


def add_user(rootfs: Path) -> None:
    """The image's user and group, written directly (useradd would stamp today's date)."""
    with (rootfs / "etc/passwd").open("a") as handle:
        handle.write(f"kvgate:x:{UID}:{GID}:kvgate:/nonexistent:/usr/sbin/nologin\n")
    with (rootfs / "etc/group").open("a") as handle:
        handle.write(f"kvgate:x:{GID}:\n")


def wheelhouse(cache: Path) -> Path:
    """The locked wheels for CPython 3.11 on manylinux x86_64, downloaded once (hashes checked)."""
    pins = lock_pins(REQUIREMENTS_LOCK)
    key = hashlib.sha256(REQUIREMENTS_LOCK.read_bytes()).hexdigest()[:16]
    house = cache / "wheels" / key
    if (house / ".complete").exists():
        return house
    tmp = house.with_name(house.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            "3.11",
            "--abi",
            "cp311",
            *(f"--platform={p}" for p in platforms),
            "-r",
            str(REQUIREMENTS_LOCK),
            "-d",
            str(tmp),
        ]
    )
    got = len(list(tmp.glob("*.whl")))
    if got != len(pins):
        raise BuildError(f"wheelhouse has {got} wheels for {len(pins)} locked requirements")
    (tmp / ".complete").touch()
    shutil.rmtree(house, ignore_errors=True)
    tmp.rename(house)
    return house


def kvgate_wheel(uv: Path, work: Path, epoch: int) -> Path:
    """kvgate's own wheel from its sources, built by the locked setuptools."""
    src = work / "src"
    for path in source_files():
        target = src / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    out = work / "dist"
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    run(
        [
            str(uv),
            "build",
            "--quiet",
            "--wheel",
            "--out-dir",
            str(out),
            "--build-constraints",
            str(BUILD_CONSTRAINTS_LOCK),
            "--require-hashes",
            str(src),
        ],
        env=env,
    )
    (wheel,) = out.glob("kvgate-*.whl")
    return wheel


def install_kvgate(rootfs: Path, uv: Path, house: Path, wheel: Path, epoch: int) -> None:
    """/opt/kvgate in the rootfs: a venv of Debian's python3.11 with the locked wheels, offline."""
    stage = rootfs / "tmp/kvgate-build"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "wheels").mkdir(parents=True)
    for whl in [*house.glob("*.whl"), wheel]:
        shutil.copy2(whl, stage / "wheels" / whl.name)
    shutil.copy2(REQUIREMENTS_LOCK, stage / "requirements.lock")
    shutil.copy2(uv, stage / "uv")
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/tmp/kvgate-build",
        "LC_ALL": "C.UTF-8",
        "SOURCE_DATE_EPOCH": str(epoch),
        "UV_CACHE_DIR": "/tmp/kvgate-build/cache",
        "UV_NO_PROGRESS": "1",
        "UV_LINK_MODE": "copy",
    }
    root = str(rootfs)
    try:
        run(["chroot", root, "/usr/bin/python3.11", "-m", "venv", "--without-pip", VENV], env=env)
        install = ["chroot", root, "/tmp/kvgate-build/uv", "pip", "install", "--no-deps"]
        install += ["--python", f"{VENV}/bin/python", "--offline", "--no-index", "--quiet"]
        install += ["--find-links", "/tmp/kvgate-build/wheels"]
        lock = "/tmp/kvgate-build/requirements.lock"
        run([*install, "--require-hashes", "-r", lock], env=env)
        run([*install, f"/tmp/kvgate-build/wheels/{wheel.name}"], env=env)
        forget_install_times(rootfs / VENV.lstrip("/"))
        # Bytecode checked by content, not by mtime: reproducible, and valid on a read-only root.
        run(
            [
                "chroot",
                root,
                f"{VENV}/bin/python",
                "-m",
                "compileall",
                "-q",
                "-j",
                "1",
                "--invalidation-mode",
                "unchecked-hash",
                f"{VENV}/lib",
            ],
            env=env,
        )
        # The image must start: every command the chart and the pods run answers --help.
        for argv in (
            ["kvgate", "--help"],
            ["kvgate", "operator", "--help"],
            ["kvgate", "webhook", "--help"],
            ["kvgate", "guard", "--help"],
            ["kvgate", "fetch-model", "--help"],
            ["kubectl-kvgate", "--help"],
        ):
            subprocess.run(
                ["chroot", root, f"{VENV}/bin/{argv[0]}", *argv[1:]],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        torch = subprocess.run(
            ["chroot", root, f"{VENV}/bin/python", "-c", "import torch"],
            env=env,
            capture_output=True,
        )
        if torch.returncode == 0:
            raise BuildError("torch is importable in the image; nothing in kvgate needs it")
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def debian_rootfs(rootfs: Path, cache: Path, lock: DebianLock) -> None:
    """The Debian layer's tree: the locked packages and the kvgate user, no apt cache, no logs."""
    mmdebstrap(lock, rootfs, cache / "debs")
    add_user(rootfs)
    for junk in ("var/cache/apt/archives", "var/log"):
        for child in sorted((rootfs / junk).glob("*")):
            if child.is_file():
                child.unlink()


def kvgate_venv(rootfs: Path, work: Path, cache: Path, uv: Path, epoch: int) -> None:
    """The kvgate layer's tree: /opt/kvgate from the locked wheels and kvgate's own wheel."""
    house = wheelhouse(cache)
    wheel = kvgate_wheel(uv, work, epoch)
    install_kvgate(rootfs, uv, house, wheel, epoch)


def rootfs_only(target: Path, cache: Path, uv: Path) -> None:
    """Both layers' trees in one directory, unpacked (operator/Dockerfile copies it)."""
    if target.exists() and any(target.iterdir()):
        raise BuildError(f"{target} is not empty; the rootfs goes into a new directory")
    with tempfile.TemporaryDirectory(prefix="kvgate-rootfs-", dir=cache) as tmp:
        debian_rootfs(target, cache, read_debian_lock())
        kvgate_venv(target, Path(tmp), cache, uv, source_epoch())


def forget_install_times(venv: Path) -> None:
    """uv records when it installed each wheel (dist-info/uv_cache.json, a timestamp): drop it and
    its RECORD line, so the layer depends on what was installed, not when."""
    for stamp in sorted(venv.glob("lib/python3.11/site-packages/*.dist-info/uv_cache.json")):
        record = stamp.parent / "RECORD"
        line = f"{stamp.parent.name}/{stamp.name},"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(x for x in lines if not x.startswith(line)))
        stamp.unlink()


@dataclass(frozen=True)
class Built:
    archive: Path
    digest: str
    ref: str


def build(out: Path, cache: Path, uv: Path, image: str, use_cache: bool = True) -> Built:
    if os.geteuid() != 0:
        raise BuildError(
            "the image build needs root (mmdebstrap --mode=root and chroot); run it as root"
        )
    version = _project_version()
    ref = f"{image}:{version}"
    name = f"kvgate-operator-{version}.oci.tar"
    key = inputs_key(uv)
    cached = cache / "archives" / key / name
    out.mkdir(parents=True, exist_ok=True)
    target = out / name
    if (
        use_cache
        and cached.exists()
        and (cached.parent / "digest").exists()
        and _ref_of(cached) == ref
    ):
        shutil.copyfile(cached, target)
        os.utime(cached.parent)  # recently used: pruned last
        digest = (cached.parent / "digest").read_text().strip()
        print(f"image {ref} {digest} (cached: inputs {key} unchanged)")
        return Built(target, digest, ref)
    lock = read_debian_lock()
    epoch = source_epoch()
    with tempfile.TemporaryDirectory(prefix="kvgate-image-", dir=cache) as tmp:
        work = Path(tmp)
        rootfs = work / "rootfs"
        debian_rootfs(rootfs, cache, lock)
        base = layer_tar(
            rootfs,
            sorted(p.name for p in rootfs.iterdir()),
            lock.epoch,
            skip_under=("dev", "proc", "sys", "tmp", "run"),
        )
        kvgate_venv(rootfs, work, cache, uv, epoch)
        app = layer_tar(rootfs, ["opt"], epoch)
        layers = [
            Layer(
                base,
                gzip_bytes(base),
                f"debian {lock.suite}: {len(lock.packages)} packages of debian.lock",
            ),
            Layer(app, gzip_bytes(app), f"{VENV}: kvgate {version} and requirements.lock"),
        ]
        archive, digest = oci_archive(layers, epoch, ref, version)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp_archive = cached.with_name(name + f".tmp-{os.getpid()}")
    tmp_archive.write_bytes(archive)
    tmp_archive.rename(cached)
    (cached.parent / "digest").write_text(digest + "\n")
    shutil.copyfile(cached, target)
    prune_archives(cached.parent.parent)
    print(f"image {ref} {digest} ({len(archive) / 2**20:.1f} MiB; built from inputs {key})")
    return Built(target, digest, ref)


# Archives kept in the cache (76 MiB each): every commit is a new epoch, hence a new archive.
KEEP_ARCHIVES = 3


def prune_archives(archives: Path, keep: int = KEEP_ARCHIVES) -> list[Path]:
    """All but the `keep` most recently built or used archives go; returns those removed."""
    folders = sorted(
        (d for d in archives.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True
    )
    for old in folders[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return folders[keep:]


def _ref_of(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["io.containerd.image.name"])


def _project_version() -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    if not match:
        raise BuildError("pyproject.toml has no version")
    return match.group(1)


# ---------------------------------------------------------------- refreshing the locks


def uv_compile(uv: Path, source: Path, out: Path, *options: str) -> None:
    """A hashed lock of `source`'s requirements for CPython 3.11."""
    argv = [str(uv), "pip", "compile", "--quiet", "--no-header", "--generate-hashes"]
    argv += ["--python-version", "3.11", *options, str(source), "-o", str(out)]
    run(argv, env={**os.environ, "UV_NATIVE_TLS": "1"}, cwd=REPO)


def refresh_locks(uv: Path, cache: Path) -> None:
    """Resolve today's newest inputs into the three lock files (review the diff, then commit)."""
    platform = ("--python-platform", "x86_64-manylinux_2_36")
    uv_compile(uv, REPO / "pyproject.toml", REQUIREMENTS_LOCK, *platform, "--extra", "operator")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        wanted = Path(tmp) / "build.in"
        wanted.write_text("setuptools\nwheel\n")
        # No "via" comments: they would name this temporary file.
        uv_compile(uv, wanted, BUILD_CONSTRAINTS_LOCK, "--no-annotate")
        old = read_debian_lock()
        rootfs = Path(tmp) / "rootfs"
        run(
            [
                "mmdebstrap",
                "--mode=root",
                "--variant=essential",
                "--format=directory",
                "--quiet",
                "--include=" + ",".join(DEBIAN_ROOTS),
                old.suite,
                str(rootfs),
                *old.sources,
            ]
        )
        listed = subprocess.run(
            ["chroot", str(rootfs), "dpkg-query", "-W", "-f", "${Package}=${Version}\n"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
    DEBIAN_LOCK.write_text(debian_lock_text(old, listed, now=int(time.time())))


def debian_lock_text(old: DebianLock, listed: list[str], now: int) -> str:
    """The lock for the packages `listed`. The epoch moves only with the packages: a refresh
    that changes nothing changes no byte of the lock, nor the Debian layer's digest."""
    same = sorted(listed) == sorted(old.packages)
    lines = [
        "# The Debian packages of kvgate's image, each at one version (operator/image/build.py).",
        f"# Made by `make image-lock` from {', '.join(DEBIAN_ROOTS)} and Debian's essential set;",
        "# epoch: the Debian layer's file times (when its package list last changed).",
        f"suite {old.suite}",
        *(f"source {s}" for s in old.sources),
        f"epoch {old.epoch if same else now}",
        *(f"package {p}" for p in sorted(listed)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        nargs="?",
        choices=["build", "lock", "rootfs"],
        default="build",
        help="build: the OCI archive (default); lock: refresh the lock files; "
        "rootfs: both layers unpacked into --out (operator/Dockerfile)",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "dist", help="where the archive goes (dist/)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache/kvgate")) / "image",
        help="downloaded packages and wheels, and built archives by input hash",
    )
    parser.add_argument(
        "--uv", type=Path, default=Path(shutil.which("uv") or "uv"), help="the uv binary"
    )
    parser.add_argument(
        "--image",
        default=os.environ.get("IMAGE", DEFAULT_IMAGE),
        help=f"the image's name inside the archive (default {DEFAULT_IMAGE})",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="build even if these inputs were built"
    )
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    try:
        if args.command == "lock":
            refresh_locks(args.uv, args.cache)
            return 0
        if args.command == "rootfs":
            if os.geteuid() != 0:
                raise BuildError("the rootfs build needs root (mmdebstrap --mode=root and chroot)")
            rootfs_only(args.out, args.cache, args.uv)
            return 0
        built = build(args.out, args.cache, args.uv, args.image, use_cache=not args.no_cache)
    except BuildError as error:
        print(f"make image: {error}", file=sys.stderr)
        return 2
    print(f"archive: {built.archive}")
    print(f"digest:  {built.digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
