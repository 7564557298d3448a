"""The image `make image` builds, built again and run in real containers (containerd and runc,
no kubelet): one digest for one commit; non-root, read-only root, no capabilities, seccomp; the
guard and the verifier doing their jobs from inside it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from factories.admission_reviews import mutated, review, sample
from factories.fake_engine import FakeEngine, running
from kvgate.kube.tls import make_ca, make_serving_cert, write_tls_dir
from kvgate_e2e.model_hub import HubState, serving
from kvgate_e2e.netns import TcpRelay, temporary_namespace

from .conftest import Containerd, image_cache, makefile_uv, require_image_tools

pytestmark = pytest.mark.image

# The restrictions Pod Security `restricted` and the chart put on every kvgate container, as
# runc applies them here: the image's own user, a read-only root, every capability dropped,
# the runtime's default seccomp profile.
# ctr takes no "ALL": the capabilities of containerd's default spec, each dropped by name (the
# test below reads the bounding set the process ends up with, so a missed one fails it).
DEFAULT_SPEC_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
RESTRICTED = [
    "--read-only",
    "--seccomp",
    *(arg for cap in DEFAULT_SPEC_CAPABILITIES for arg in ("--cap-drop", cap)),
]


@pytest.fixture(scope="session")
def archive(image_build: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive `make image` made (from the build cache when the inputs are unchanged)."""
    require_image_tools()
    out = tmp_path_factory.mktemp("image-a")
    cache = image_cache()
    built = image_build.build(out, cache, makefile_uv(), image_build.DEFAULT_IMAGE)
    return Path(built.archive)


def read_json(archive: Path, name: str) -> dict[str, object]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return dict(json.load(member))


def manifest_digest(archive: Path) -> str:
    index = read_json(archive, "index.json")
    return str(index["manifests"][0]["digest"])  # type: ignore[index]


def image_config(archive: Path) -> dict[str, object]:
    digest = manifest_digest(archive)
    manifest = read_json(archive, f"blobs/sha256/{digest.split(':')[1]}")
    config_digest = str(manifest["config"]["digest"])  # type: ignore[index]
    return read_json(archive, f"blobs/sha256/{config_digest.split(':')[1]}")


def test_two_builds_of_one_commit_give_one_digest(
    image_build: ModuleType, archive: Path, tmp_path: Path
) -> None:
    cache = image_cache()
    again = image_build.build(
        tmp_path, cache, makefile_uv(), image_build.DEFAULT_IMAGE, use_cache=False
    )
    assert again.digest == manifest_digest(archive)
    assert Path(again.archive).read_bytes() == archive.read_bytes()


def test_the_image_configuration_runs_kvgate_as_non_root(
    image_build: ModuleType, archive: Path
) -> None:
    config = image_config(archive)
    assert config["config"] == image_build.CONFIG
    assert config["config"]["User"] == "65532:65532"  # type: ignore[index]
    assert len(config["rootfs"]["diff_ids"]) == 2  # type: ignore[index]


@pytest.fixture(scope="session")
def image(containerd: Containerd, archive: Path) -> str:
    containerd.ctr("images", "import", str(archive))
    ref = str(
        read_json(archive, "index.json")["manifests"][0]["annotations"]["io.containerd.image.name"]
    )  # type: ignore[index]
    listed = containerd.ctr("images", "list", "-q").stdout.split()
    assert ref in listed, f"{ref} not among the imported images {listed}"
    return ref


_names = iter(range(1_000_000))


def run_once(
    containerd: Containerd, image: str, *argv: str, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """One container, to completion; the image's own user and the restricted settings."""
    name = f"once-{os.getpid()}-{next(_names)}"
    return containerd.ctr("run", "--rm", *RESTRICTED, *extra, image, name, *argv, check=False)


def test_the_container_runs_as_65532_on_a_read_only_root_with_no_capabilities(
    containerd: Containerd, image: str
) -> None:
    ids = run_once(containerd, image, "id")
    assert ids.returncode == 0, ids.stderr
    assert "uid=65532(kvgate) gid=65532(kvgate)" in ids.stdout
    write = run_once(containerd, image, "sh", "-c", "touch /opt/kvgate/x")
    assert write.returncode != 0
    assert "Read-only file system" in write.stderr + write.stdout
    status = run_once(
        containerd, image, "grep", "-E", "^(CapEff|CapPrm|CapBnd|Seccomp):", "/proc/self/status"
    )
    fields = dict(line.split(":\t") for line in status.stdout.strip().splitlines())
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0" * 16, status.stdout
    assert fields["Seccomp"] == "2", "the runtime's default seccomp profile filters the process"


def test_every_command_the_chart_runs_starts_in_the_container(
    containerd: Containerd, image: str
) -> None:
    for argv in (
        ["kvgate", "--version"],
        ["kvgate", "operator", "--help"],
        ["kvgate", "webhook", "--help"],
        ["kvgate", "guard", "--help"],
        ["kvgate", "fetch-model", "--help"],
        ["kubectl-kvgate", "--help"],
    ):
        done = run_once(containerd, image, *argv)
        assert done.returncode == 0, f"{argv}: exit {done.returncode}: {done.stderr[-1000:]}"
    torch = run_once(containerd, image, "python", "-c", "import torch")
    assert torch.returncode != 0, "the image must not carry torch"


def test_kvgate_verify_in_the_container_refuses_the_incident_pool(
    containerd: Containerd, image: str
) -> None:
    async def scenario() -> subprocess.CompletedProcess[str]:
        engine = FakeEngine(role="prefill", context_length=1_048_576, kv_pool_tokens=681_280)
        async with running(engine):
            return await asyncio.to_thread(
                run_once,
                containerd,
                image,
                "kvgate",
                "verify",
                "--url",
                engine.url,
                "--context-length",
                "1048576",
                "--role",
                "prefill",
                extra=("--net-host",),
            )

    done = asyncio.run(scenario())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "681,280" in done.stdout and "1,048,576" in done.stdout


GUARD_PERIOD_S = 1.0
# A guard that has not answered /ready in this long is broken, not slow: it would miss 60 of its
# periods. (The first answer also waits for the container to start: measured and printed.)
GUARD_DEADLINE_S = 60.0


def ready_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def wait_ready_status(port: int, want: int) -> float:
    start = time.monotonic()
    while (status := ready_status(port)) != want:
        assert time.monotonic() - start < GUARD_DEADLINE_S, f"/ready stayed {status}, wanted {want}"
        time.sleep(0.1)
    return time.monotonic() - start


@pytest.fixture
def guard_container(containerd: Containerd, image: str) -> Iterator[tuple[FakeEngine, int]]:
    """The guard sidecar's command in its container, beside a fake engine on loopback."""
    loop = asyncio.new_event_loop()
    engine = FakeEngine(role="decode", context_length=131_072, kv_pool_tokens=200_000)
    server = running(engine)
    loop.run_until_complete(server.__aenter__())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    name = f"guard-{os.getpid()}"
    guard = ["kvgate", "guard", "--engine-host", "127.0.0.1", "--engine-port", str(engine.port)]
    guard += ["--context-length", "131072", "--role", "decode", "--min-version", "0.5.22"]
    guard += ["--host", "127.0.0.1", "--port", str(port), "--period", str(GUARD_PERIOD_S)]
    try:
        with containerd.background(name, *RESTRICTED, "--net-host", image, name, *guard):
            yield engine, port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(server.__aexit__(None, None, None))
        loop.close()


def test_the_guard_in_its_container_turns_not_ready_when_its_engine_shrinks(
    guard_container: tuple[FakeEngine, int],
) -> None:
    engine, port = guard_container
    started = wait_ready_status(port, 200)
    print(f"guard in its container: first 200 on /ready {started:.1f} s after the run began")
    engine.kv_pool_tokens = 44_584  # the engine restarted on a smaller pool
    flipped = wait_ready_status(port, 503)
    print(f"guard: /ready 503 {flipped:.1f} s after the pool shrank (period {GUARD_PERIOD_S} s)")
    engine.kv_pool_tokens = 200_000
    wait_ready_status(port, 200)


WEBHOOK_PORT = 9443
# The webhook's first answer waits for the container to start and Python to import kvgate; one
# that takes longer than this is broken, not slow (measured and printed).
WEBHOOK_DEADLINE_S = 120.0


def post_review(port: int, body: dict[str, Any], tls: Path) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/validate-modeldeployment",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return dict(json.load(response))


def test_the_webhook_in_its_container_denies_an_unsafe_spec_with_its_numbers(
    containerd: Containerd, image: str, tmp_path: Path
) -> None:
    """`kvgate webhook` as the chart runs it: in its own network namespace, its certificate
    mounted read-only (a Secret's default mode, 0644), reached over HTTPS."""
    tls = tmp_path / "tls"
    tls.mkdir()
    ca = make_ca()
    write_tls_dir(tls, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    for path in [tls, *tls.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    name = f"webhook-{os.getpid()}"
    mount = f"type=bind,src={tls},dst=/tls,options=rbind:ro"
    webhook = ["kvgate", "webhook", "--tls-dir", "/tls", "--port", str(WEBHOOK_PORT)]
    with (
        temporary_namespace() as netns,
        containerd.background(
            name,
            *RESTRICTED,
            "--with-ns",
            f"network:{netns.path}",
            "--mount",
            mount,
            image,
            name,
            *webhook,
        ) as proc,
    ):
        relay = TcpRelay(lambda: netns.connect("127.0.0.1", WEBHOOK_PORT), name="webhook")
        try:
            start = time.monotonic()
            safe = review(sample())
            while True:
                try:
                    answer = post_review(relay.port, safe, tls)
                    break
                except OSError as error:
                    assert proc.poll() is None, (
                        f"the webhook container exited: {proc.stdout.read() if proc.stdout else ''}"
                    )
                    assert time.monotonic() - start < WEBHOOK_DEADLINE_S, f"no answer: {error}"
                    time.sleep(0.2)
            print(
                "webhook in its container: first answer "
                f"{time.monotonic() - start:.1f} s after the run began"
            )
            assert answer["response"]["allowed"] is True
            denied = post_review(relay.port, review(mutated({"spec.decode.gpuMemoryGiB": 25})), tls)
            assert denied["response"]["allowed"] is False
            message = denied["response"]["status"]["message"]
            assert message.startswith(
                "spec.decode: estimated KV pool 44,236 tokens < contextLength 131,072"
            ), message
        finally:
            relay.close()


HUB_REPO = "kvgate-test/tiny-model"
HUB_FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 384}).encode(),
    "model.safetensors": bytes(range(256)) * 4096,  # 1 MiB, served as an LFS file
}


def test_fetch_model_in_its_container_lands_the_snapshot_with_the_token_from_its_env(
    containerd: Containerd, image: str, tmp_path: Path
) -> None:
    """The init container of `spec.model.source.download`: `kvgate fetch-model` as user 65532,
    the token from its environment, into a volume (a bind mount the user may write)."""
    root = tmp_path / "hub"
    for rel, data in HUB_FILES.items():
        (root / HUB_REPO / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / HUB_REPO / rel).write_bytes(data)
    dest = tmp_path / "models"
    dest.mkdir()
    os.chown(dest, 65532, 65532)
    token = "hf_container-token-never-logged"
    with serving(HubState(root=root, token=token)) as hub:
        done = run_once(
            containerd,
            image,
            "kvgate",
            "fetch-model",
            "--repo",
            HUB_REPO,
            "--endpoint",
            hub.url,
            "--dest",
            "/models/tiny",
            "--token-env",
            "HF_TOKEN",
            extra=(
                "--net-host",
                "--env",
                f"HF_TOKEN={token}",
                "--mount",
                f"type=bind,src={dest},dst=/models,options=rbind:rw",
            ),
        )
    assert done.returncode == 0, done.stdout + done.stderr
    for rel, data in HUB_FILES.items():
        assert (dest / "tiny" / rel).read_bytes() == data, rel
        assert (dest / "tiny" / rel).stat().st_uid == 65532
    assert token not in done.stdout + done.stderr
