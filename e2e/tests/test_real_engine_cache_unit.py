"""The real-engine scenarios' disk caches (kvgate_e2e.real_engine_cache) and the directory entries
of kvgate_e2e.content_cache they keep the tiny Llama in. No SGLang, no world.

A stand-in SGLang CPU environment (a ``site`` with dist-info RECORDs and install.sh's stamp) and a
stand-in model script that counts its runs show whether the model was generated or copied from the
cache; a known answer's ``record`` counts its calls the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e import content_cache, real_engine_cache
from kvgate_e2e.content_cache import CACHE_ENTRY, cached_directory
from kvgate_e2e.polling import poll_until
from kvgate_e2e.real_engine import SglangCpu
from kvgate_e2e.real_engine_cache import (
    NO_CACHE,
    known_answer,
    make_tiny_llama,
    tiny_llama,
    without_flags,
)

FAKE_MODEL_SCRIPT = """\
import json, sys
from pathlib import Path
out, seed = Path(sys.argv[1]), int(sys.argv[3])
here = Path(__file__).parent
with open(here / "runs", "a") as runs:
    runs.write("run\\n")
if (here / "fail").exists():
    sys.exit(3)
out.mkdir(parents=True, exist_ok=True)
if not (here / "write-nothing").exists():
    (out / "config.json").write_text(json.dumps({"vocab_size": 384}))
    (out / "kvgate-tiny-llama.json").write_text(json.dumps({"seed": seed}))
    (out / "model.safetensors").write_bytes(bytes(range(256)) * (seed + 1))
"""


class ModelScript:
    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.path = directory / "make_tiny_llama.py"
        self.path.write_text(FAKE_MODEL_SCRIPT)
        self.directory = directory

    @property
    def runs(self) -> int:
        runs = self.directory / "runs"
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    def fail(self) -> None:
        (self.directory / "fail").touch()

    def write_nothing(self) -> None:
        (self.directory / "write-nothing").touch()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SglangCpu:
    """A stand-in installed SGLang 0.5.23 for CPU under a temporary KVGATE_CACHE."""
    monkeypatch.setenv("KVGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(NO_CACHE, raising=False)
    root = tmp_path / "cache" / "sglang-cpu" / "0.5.23"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libcuda.so.1").touch()
    (root / ".kvgate-complete-0123456789ab").touch()
    for name in ("sglang-0.5.23", "torch-2.9.0", "transformers-4.57.1"):
        record = root / "site" / f"{name}.dist-info" / "RECORD"
        record.parent.mkdir(parents=True)
        record.write_text(f"{name}/__init__.py,sha256=x,0\n")
    return SglangCpu("0.5.23", root)


@pytest.fixture
def script(tmp_path: Path) -> ModelScript:
    return ModelScript(tmp_path / "script")


def model_cache(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "real-engine" / "tiny-llama"


def entries(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_dir()) if directory.exists() else []


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# ---------------------------------------------------------------------- the tiny Llama
def test_the_tiny_llama_is_generated_once_and_every_caller_gets_a_copy_of_its_own(
    env: SglangCpu, script: ModelScript, tmp_path: Path
) -> None:
    first = tiny_llama(env, sys.executable, tmp_path / "a", 0, script=script.path)
    assert script.runs == 1 and first.computed
    assert first.value == tmp_path / "a"
    assert set(files(first.value)) == {"config.json", "kvgate-tiny-llama.json", "model.safetensors"}

    second = tiny_llama(env, sys.executable, tmp_path / "b", 0, script=script.path)
    assert script.runs == 1 and not second.computed  # copied, not generated
    assert second.key == first.key
    assert files(second.value) == files(first.value)

    # A copy is private: what a pod (or anything) does to it never reaches the cache.
    (second.value / "model.safetensors").write_bytes(b"overwritten")
    (second.value / "config.json").unlink()
    third = tiny_llama(env, sys.executable, tmp_path / "c", 0, script=script.path)
    assert script.runs == 1 and files(third.value) == files(first.value)
    [entry] = entries(model_cache(tmp_path))
    assert not (second.value / "model.safetensors").samefile(entry / "model.safetensors")


def test_make_tiny_llama_keeps_a_model_already_in_its_directory(
    env: SglangCpu, script: ModelScript, tmp_path: Path
) -> None:
    out = make_tiny_llama(env, sys.executable, tmp_path / "work" / "tiny-llama", script=script.path)
    assert out == tmp_path / "work" / "tiny-llama" and script.runs == 1
    (out / "model.safetensors").write_bytes(b"the demo's own")
    assert make_tiny_llama(env, sys.executable, out, script=script.path) == out
    assert (out / "model.safetensors").read_bytes() == b"the demo's own"


def _script_edited(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    script.path.write_text(FAKE_MODEL_SCRIPT + "# another generator\n")
    return {}


def _another_seed(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    return {"seed": 1}


def _torch_reinstalled(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    (env.site / "torch-2.9.0.dist-info" / "RECORD").write_text("torch/__init__.py,sha256=y,1\n")
    return {}


def _transformers_upgraded(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    old = env.site / "transformers-4.57.1.dist-info"
    old.rename(env.site / "transformers-4.58.0.dist-info")
    return {}


def _another_sglang(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    (env.site / "sglang-0.5.23.dist-info").rename(env.site / "sglang-0.5.24.dist-info")
    return {}


def _install_script_changed(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    (env.root / ".kvgate-complete-0123456789ab").rename(env.root / ".kvgate-complete-ba9876543210")
    return {}


def _torch_variable_set(env: SglangCpu, script: ModelScript) -> dict[str, Any]:
    return {"variable": ("TORCH_KVGATE_TEST_SWITCH", "1")}


@pytest.mark.parametrize(
    "change",
    [
        _script_edited,
        _another_seed,
        _torch_reinstalled,
        _transformers_upgraded,
        _another_sglang,
        _install_script_changed,
        _torch_variable_set,
    ],
    ids=lambda change: change.__name__.strip("_"),
)
def test_a_change_to_anything_the_model_depends_on_generates_it_again(
    change: Callable[[SglangCpu, ModelScript], dict[str, Any]],
    env: SglangCpu,
    script: ModelScript,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = tiny_llama(env, sys.executable, tmp_path / "a", 0, script=script.path)
    changed = change(env, script)
    if "variable" in changed:
        monkeypatch.setenv(*changed["variable"])
    again = tiny_llama(
        env, sys.executable, tmp_path / "b", changed.get("seed", 0), script=script.path
    )
    assert script.runs == 2 and again.computed, "the changed model was copied from the cache"
    assert again.key != first.key
    assert len(entries(model_cache(tmp_path))) == 2


def test_variables_the_model_script_does_not_read_share_one_model(
    env: SglangCpu, script: ModelScript, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    tiny_llama(env, sys.executable, tmp_path / "a", 0, script=script.path)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("MAKELEVEL", "2")
    monkeypatch.chdir(tmp_path)
    assert not tiny_llama(env, sys.executable, tmp_path / "b", 0, script=script.path).computed
    assert script.runs == 1


def _file_truncated(entry: Path) -> None:
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


def _file_missing(entry: Path) -> None:
    (entry / "config.json").unlink()


def _file_added(entry: Path) -> None:
    (entry / "stray.bin").write_bytes(b"not the script's")


def _entry_file_missing(entry: Path) -> None:
    (entry / CACHE_ENTRY).unlink()


def _entry_file_not_json(entry: Path) -> None:
    (entry / CACHE_ENTRY).write_text("{not json")


def _entry_of_another_key(entry: Path) -> None:
    stored = json.loads((entry / CACHE_ENTRY).read_text())
    (entry / CACHE_ENTRY).write_text(json.dumps({**stored, "key": "0" * 64}))


@pytest.mark.parametrize(
    "corrupt",
    [
        _file_truncated,
        _file_missing,
        _file_added,
        _entry_file_missing,
        _entry_file_not_json,
        _entry_of_another_key,
    ],
    ids=lambda corrupt: corrupt.__name__.strip("_"),
)
def test_a_corrupt_model_entry_is_generated_again_and_never_copied(
    corrupt: Callable[[Path], None], env: SglangCpu, script: ModelScript, tmp_path: Path
) -> None:
    truth = files(tiny_llama(env, sys.executable, tmp_path / "a", 0, script=script.path).value)
    [entry] = entries(model_cache(tmp_path))
    corrupt(entry)

    again = tiny_llama(env, sys.executable, tmp_path / "b", 0, script=script.path)
    assert script.runs == 2 and again.computed
    assert files(again.value) == truth
    assert not tiny_llama(env, sys.executable, tmp_path / "c", 0, script=script.path).computed
    assert script.runs == 2  # the entry was built anew
    assert entries(model_cache(tmp_path)) == [entry]  # in place: nothing stale left beside it


def test_no_cache_generates_the_model_every_time_and_stores_the_fresh_one(
    env: SglangCpu, script: ModelScript, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_llama(env, sys.executable, tmp_path / "a", 0, script=script.path)
    monkeypatch.setenv(NO_CACHE, "1")
    assert tiny_llama(env, sys.executable, tmp_path / "b", 0, script=script.path).computed
    assert tiny_llama(env, sys.executable, tmp_path / "c", 0, script=script.path).computed
    assert script.runs == 3
    monkeypatch.delenv(NO_CACHE)
    assert not tiny_llama(env, sys.executable, tmp_path / "d", 0, script=script.path).computed
    assert script.runs == 3
    assert len(entries(model_cache(tmp_path))) == 1


@pytest.mark.parametrize("fault", ["fail", "write_nothing"])
def test_a_model_script_that_fails_or_writes_no_model_stores_nothing(
    fault: str, env: SglangCpu, script: ModelScript, tmp_path: Path
) -> None:
    getattr(script, fault)()
    with pytest.raises((subprocess.CalledProcessError, RuntimeError)):
        tiny_llama(env, sys.executable, tmp_path / "a", 0, script=script.path)
    cache = model_cache(tmp_path)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


# ---------------------------------------------------------------------- the known answer
class Server:
    """A stand-in for the unified server: ``record`` counts its calls and answers ``ids``."""

    def __init__(self, ids: list[int] | None = None) -> None:
        self.ids: list[int] = [7, 8, 9, 10] if ids is None else ids
        self.calls = 0
        self.error: BaseException | None = None

    def record(self) -> list[int]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.ids)


# Deadlines, not bounds: a thread or worker of these tests reaching its next step (a toy build
# writes a file), and a second worker process (an interpreter importing kvgate_e2e) waiting for the
# lock and finishing.
TOY_STEP_DEADLINE = 30
WORKER_DEADLINE = 60
ARGV = [
    sys.executable,
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/tmp/pytest-1/tiny-llama0",
    "--host",
    "127.0.0.1",
    "--port",
    "40001",
    "--context-length",
    "4096",
]
BODY = {"input_ids": [0, 40, 41], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
ASKER = "class KnownAnswer: ..."


@pytest.fixture
def model(env: SglangCpu, script: ModelScript, tmp_path: Path) -> Path:
    return make_tiny_llama(env, sys.executable, tmp_path / "model", script=script.path)


def answers(tmp_path: Path) -> list[Path]:
    directory = tmp_path / "cache" / "real-engine" / "known-answers"
    return sorted(directory.glob("*.json")) if directory.exists() else []


def ask(env: SglangCpu, model: Path, server: Server, **changes: Any) -> content_cache.Found[Any]:
    question: dict[str, Any] = {"argv": ARGV, "body": BODY, "asker": ASKER, **changes}
    return known_answer(
        env, model, question["argv"], question["body"], question["asker"], server.record
    )


def test_the_known_answer_is_recorded_once_then_read_back_without_a_server(
    env: SglangCpu, model: Path, tmp_path: Path
) -> None:
    server = Server()
    first = ask(env, model, server)
    assert server.calls == 1 and first.computed and first.value == [7, 8, 9, 10]
    second = ask(env, model, Server())
    assert not second.computed and second.value == [7, 8, 9, 10] and second.key == first.key
    assert len(answers(tmp_path)) == 1


def test_another_address_or_model_path_of_the_same_model_shares_the_known_answer(
    env: SglangCpu, script: ModelScript, model: Path, tmp_path: Path
) -> None:
    ask(env, model, Server())
    copy = make_tiny_llama(env, sys.executable, tmp_path / "another-copy", script=script.path)
    argv = [*ARGV[:4], str(copy), "--host=10.0.0.1", "--port=40002", *ARGV[9:]]
    server = Server()
    assert not ask(env, copy, server, argv=argv).computed
    assert server.calls == 0


def _model_file_changed(model: Path) -> dict[str, Any]:
    (model / "model.safetensors").write_bytes(b"other weights")
    return {}


def _model_file_added(model: Path) -> dict[str, Any]:
    (model / "generation_config.json").write_text("{}")
    return {}


def _another_server_flag(model: Path) -> dict[str, Any]:
    return {"argv": [*ARGV[:-1], "8192"]}


def _another_body(model: Path) -> dict[str, Any]:
    return {"body": {**BODY, "input_ids": [0, 40, 42]}}


def _another_asker(model: Path) -> dict[str, Any]:
    return {"asker": ASKER + "\n    # asks differently"}


@pytest.mark.parametrize(
    "change",
    [
        _model_file_changed,
        _model_file_added,
        _another_server_flag,
        _another_body,
        _another_asker,
    ],
    ids=lambda change: change.__name__.strip("_"),
)
def test_a_change_to_anything_the_known_answer_depends_on_records_it_again(
    change: Callable[[Path], dict[str, Any]], env: SglangCpu, model: Path, tmp_path: Path
) -> None:
    first = ask(env, model, Server())
    server = Server([1, 2, 3, 4])
    again = ask(env, model, server, **change(model))
    assert server.calls == 1 and again.computed and again.value == [1, 2, 3, 4]
    assert again.key != first.key and len(answers(tmp_path)) == 2


def test_an_sglang_reinstall_records_the_known_answer_again(
    env: SglangCpu, model: Path, tmp_path: Path
) -> None:
    ask(env, model, Server())
    (env.site / "sglang-0.5.23.dist-info" / "RECORD").write_text("sglang/x.py,sha256=z,2\n")
    server = Server()
    assert ask(env, model, server).computed and server.calls == 1


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda path: path.write_text(path.read_text()[:40]),
        lambda path: path.write_text(path.read_text().replace("[7,8,9,10]", "[7,8,9,11]")),
        lambda path: path.write_text(""),
    ],
    ids=["truncated", "answer_altered", "empty"],
)
def test_a_corrupt_known_answer_is_recorded_again_and_never_trusted(
    corrupt: Callable[[Path], None], env: SglangCpu, model: Path, tmp_path: Path
) -> None:
    ask(env, model, Server())
    [entry] = answers(tmp_path)
    corrupt(entry)
    server = Server()
    again = ask(env, model, server)
    assert server.calls == 1 and again.value == [7, 8, 9, 10]
    assert not ask(env, model, Server()).computed


def test_no_cache_records_the_known_answer_every_time_and_stores_it(
    env: SglangCpu, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ask(env, model, Server())
    monkeypatch.setenv(NO_CACHE, "1")
    server = Server([5, 5, 5, 5])
    assert ask(env, model, server).computed and server.calls == 1
    monkeypatch.delenv(NO_CACHE)
    stored = ask(env, model, Server())
    assert not stored.computed and stored.value == [5, 5, 5, 5]


@pytest.mark.parametrize("fault", ["the server exited", "an empty answer"], ids=["failed", "empty"])
def test_a_failed_or_empty_known_answer_is_never_stored(
    fault: str, env: SglangCpu, model: Path, tmp_path: Path
) -> None:
    server = Server([])
    if fault == "the server exited":
        server.error = AssertionError("unified SGLang exited")
    with pytest.raises((AssertionError, ValueError)):
        ask(env, model, server)
    assert answers(tmp_path) == []
    working = Server()
    assert ask(env, model, working).computed and working.calls == 1


def test_argv_less_run_specific_flags_in_both_spellings() -> None:
    assert without_flags(
        ["py", "--host", "h", "--port=1", "--model-path", "/m", "--context-length", "4096"],
        real_engine_cache.RUN_SPECIFIC_FLAGS,
    ) == ["py", "--context-length", "4096"]


# ---------------------------------------------------------------------- concurrent callers
def test_two_threads_asking_for_one_directory_build_it_once(tmp_path: Path) -> None:
    waiting = threading.Event()
    built: list[str] = []
    results: dict[str, bytes] = {}

    def build(who: str) -> Callable[[Path], None]:
        def run(directory: Path) -> None:
            built.append(who)
            if who == "first":
                # Hold the key until the second caller is waiting for it.
                assert waiting.wait(30), "the second caller never waited"
            (directory / "weights").write_text(who)

        return run

    def ask_for(who: str, on_wait: Callable[[], None] | None = None) -> None:
        results[who] = cached_directory(
            tmp_path / "cache",
            {"model": 1},
            build(who),
            lambda entry: (entry / "weights").read_bytes(),
            deadline_s=TOY_STEP_DEADLINE,
            on_wait=on_wait,
        ).value

    first = threading.Thread(target=ask_for, args=("first",))
    first.start()
    poll_until("the first caller to build", lambda: built, TOY_STEP_DEADLINE, period=0.01)
    second = threading.Thread(target=ask_for, args=("second", waiting.set))
    second.start()
    first.join(TOY_STEP_DEADLINE)
    second.join(TOY_STEP_DEADLINE)
    assert built == ["first"]
    assert results == {"first": b"first", "second": b"first"}


WORKER = """
import sys
from pathlib import Path
from kvgate_e2e.content_cache import cached_directory

def build(directory):
    Path({marker!r}).write_text("the second worker built")
    (directory / "weights").write_text("second")

def waiting():
    Path({waiting!r}).write_text("waiting")

found = cached_directory(Path({cache!r}), {{"model": 1}}, build,
                         lambda entry: (entry / "weights").read_text(), deadline_s=60,
                         on_wait=waiting)
print(found.value, found.computed)
"""


def test_two_processes_asking_for_one_directory_build_it_once(tmp_path: Path) -> None:
    """As two pytest-xdist workers would: the second waits on the lock, then reads the first's."""
    marker, waiting = tmp_path / "second-built", tmp_path / "second-waiting"
    cache = tmp_path / "cache"
    code = WORKER.format(marker=str(marker), waiting=str(waiting), cache=str(cache))
    second: list[subprocess.Popen[str]] = []

    def build(directory: Path) -> None:
        second.append(
            subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        )
        poll_until(
            "the second worker to wait for the lock", waiting.exists, TOY_STEP_DEADLINE, period=0.01
        )
        (directory / "weights").write_text("first")

    found = cached_directory(
        cache,
        {"model": 1},
        build,
        lambda e: (e / "weights").read_text(),
        deadline_s=WORKER_DEADLINE,
    )
    assert found.value == "first" and found.computed
    out, _ = second[0].communicate(timeout=WORKER_DEADLINE)
    assert second[0].returncode == 0
    assert out.split() == ["first", "False"]
    assert not marker.exists()
