"""The real-engine image mapping (pure): which node runs the released SGLang, and with what.

The container must get exactly kvgate's launcher argv plus only the CPU-only flags and environment
of research/sglang-cpu.md, added by the test world's mapping, never by the launcher. No cluster.
"""

from __future__ import annotations

import fcntl
import socket
from pathlib import Path

import pytest
from kvgate_e2e import real_engine
from kvgate_e2e.kubelet.images import ImageError, launch_for
from kvgate_e2e.kubelet.node import MAX_TOTAL_TOKENS_ANNOTATION
from kvgate_e2e.real_engine import (
    RELEASE_ANNOTATION,
    RUNTIME_ANNOTATION,
    SGLANG_CPU,
    flag_value,
)
from kvgate_engine.launcher import EngineLaunch, engine_argv

REAL = {RUNTIME_ANNOTATION: SGLANG_CPU}


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake installed 0.5.23 environment under a temporary KVGATE_CACHE."""
    root = tmp_path / "sglang-cpu" / "0.5.23"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libcuda.so.1").touch()
    (root / ".kvgate-complete-abc").touch()
    monkeypatch.setenv("KVGATE_CACHE", str(tmp_path))
    return root


def launcher_argv(role: str) -> list[str]:
    return engine_argv(
        EngineLaunch(
            role=role,  # type: ignore[arg-type]
            image="lmsysorg/sglang:v0.5.23",
            model_path="/var/lib/kvgate-e2e/tiny-llama",
            served_model_name="tiny",
            port=30000,
            context_length=4096,
            mem_fraction_static=0.05,
            tensor_parallel=1,
            page_size=1,
            kv_cache_dtype="auto",
            transfer_backend="mooncake",
            bootstrap_port=8998,
            max_total_tokens=8192,
        )
    )


def launch(argv: list[str], annotations: dict[str, str] | None) -> tuple[tuple[str, ...], dict]:  # type: ignore[type-arg]
    result = launch_for(
        "lmsysorg/sglang:v0.5.23",
        argv[:3],
        argv[3:],
        pod_ip="198.18.1.7",
        python="/venv/bin/python",
        venv_bin="/venv/bin",
        gpu_memory_gib=80.0,
        node_annotations=annotations,
    )
    return result.argv, dict(result.env)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_real_engine_node_runs_sglang_with_the_launcher_argv_plus_only_the_cpu_flags(
    installed: Path, role: str
) -> None:
    argv = launcher_argv(role)
    got, env = launch(argv, REAL)
    flags = [("198.18.1.7" if a == "0.0.0.0" else a) for a in argv[3:]]
    role_flags = (
        ["--disable-overlap-schedule"]
        if role == "prefill"
        else ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    )
    assert list(got) == [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        *flags,
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--disable-cuda-graph",
        "--max-running-requests",
        "16",
        "--sleep-on-idle",
        *role_flags,
    ]
    expected_env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "MOONCAKE_PROTOCOL": "tcp",
        "PYTHONPATH": str(installed / "site"),
        "LD_LIBRARY_PATH": str(installed / "lib"),
        "SGLANG_HOST_IP": "198.18.1.7",  # no NIC and no route in the world's network namespace
    }
    if role == "prefill":
        expected_env["SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"] = "1"
    assert env == expected_env


def test_the_launcher_itself_adds_no_cpu_flag() -> None:
    argv = launcher_argv("prefill")
    for flag in (
        "--device",
        "--attention-backend",
        "--disable-cuda-graph",
        "--disable-overlap-schedule",
    ):
        assert flag not in argv


@pytest.mark.parametrize("annotations", [None, {}, {RUNTIME_ANNOTATION: "reference"}])
def test_other_nodes_keep_the_reference_engine(
    installed: Path, annotations: dict[str, str] | None
) -> None:
    got, env = launch(launcher_argv("decode"), annotations)
    assert got[1:3] == ("-m", "kvgate_engine.reference")
    assert "PYTHONPATH" not in env


def test_a_node_pool_cap_appends_max_total_tokens_which_wins_as_the_last_flag(
    installed: Path,
) -> None:
    argv = launcher_argv("decode")
    got, _ = launch(argv, {**REAL, MAX_TOTAL_TOKENS_ANNOTATION: "2048"})
    assert flag_value(argv, "--max-total-tokens") == "8192"  # kvgate's, from maxTotalTokens
    # right after kvgate's flags, before the CPU flags
    assert got[len(argv) : len(argv) + 2] == ("--max-total-tokens", "2048")
    assert flag_value(got, "--max-total-tokens") == "2048"


def test_a_bad_pool_cap_is_refused_naming_the_annotation(installed: Path) -> None:
    with pytest.raises(ImageError, match=MAX_TOTAL_TOKENS_ANNOTATION):
        launch(launcher_argv("decode"), {**REAL, MAX_TOTAL_TOKENS_ANNOTATION: "lots"})


def test_a_release_not_installed_names_the_install_command(installed: Path) -> None:
    with pytest.raises(ImageError, match=r"SGLANG_CPU_VERSIONS=0.5.22 e2e/sglang-cpu/install.sh`"):
        launch_for(
            "lmsysorg/sglang:v0.5.22",
            [],
            ["--model-path", "m"],
            pod_ip="198.18.1.7",
            python="p",
            venv_bin="/v",
            gpu_memory_gib=None,
            node_annotations=REAL,
        )


def test_an_image_without_a_version_cannot_run_for_real(installed: Path) -> None:
    with pytest.raises(ImageError, match="tag names an SGLang version"):
        launch_for(
            "lmsysorg/sglang:latest",
            [],
            ["--model-path", "m"],
            pod_ip="198.18.1.7",
            python="p",
            venv_bin="/v",
            gpu_memory_gib=None,
            node_annotations=REAL,
        )


def test_flag_value_reads_the_last_occurrence_in_both_spellings() -> None:
    assert flag_value(["--a", "1", "--a=2"], "--a") == "2"
    assert flag_value(["--a=2", "--a", "3"], "--a") == "3"
    assert flag_value(["--ab", "1"], "--a") is None


def test_cache_root_follows_kvgate_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_CACHE", "/x")
    assert real_engine.cache_root() == Path("/x/sglang-cpu")


def test_the_unified_server_port_is_free_and_below_the_ephemeral_range_relays_draw_from() -> None:
    low = int(real_engine.EPHEMERAL_PORTS.read_text().split()[0])
    port = real_engine.unified_server_port()
    assert 1024 <= port < low
    with socket.socket() as server, socket.socket() as relay:
        server.bind(("127.0.0.1", port))  # still free
        relay.bind(("127.0.0.1", 0))  # as World.forward binds its relays
        assert relay.getsockname()[1] >= low


def test_a_node_resolves_an_unversioned_tag_to_the_release_it_names(
    installed: Path, tmp_path: Path
) -> None:
    """A tag that names no release (``latest``, a private mirror's tag) runs the release the
    node's ``e2e.kvgate.io/sglang-release`` names: what admission cannot read from the image."""
    old = tmp_path / "sglang-cpu" / "0.5.19"
    (old / "lib").mkdir(parents=True)
    (old / "lib" / "libcuda.so.1").touch()
    (old / ".kvgate-complete-abc").touch()
    got = launch_for(
        "registry.example/inference/sglang:prod",
        [],
        ["--model-path", "m"],
        pod_ip="198.18.1.7",
        python="p",
        venv_bin="/v",
        gpu_memory_gib=None,
        node_annotations={**REAL, RELEASE_ANNOTATION: "0.5.19"},
    )
    assert got.argv[:3] == ("p", "-m", "sglang.launch_server")
    assert got.env["PYTHONPATH"] == str(old / "site")


def test_an_image_tag_with_a_version_wins_over_the_nodes_release(installed: Path) -> None:
    got = launch_for(
        "lmsysorg/sglang:v0.5.23",
        [],
        ["--model-path", "m"],
        pod_ip="198.18.1.7",
        python="p",
        venv_bin="/v",
        gpu_memory_gib=None,
        node_annotations={**REAL, RELEASE_ANNOTATION: "0.5.19"},
    )
    assert got.env["PYTHONPATH"] == str(installed / "site")


def test_only_one_real_pair_holder_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one module holds the real-engine turn, another (its own open file, as another
    xdist worker has) cannot take it; once released, it can."""
    monkeypatch.setenv("KVGATE_CACHE", str(tmp_path))
    lock = tmp_path / "real-engine-pair.lock"
    with (
        real_engine.one_real_pair_at_a_time(),
        lock.open("a") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with lock.open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
