"""The conformance tier's cache of what each SGLang release answers (factories/release_answers.py).

A stand-in release environment (``sglang/srt/server_args.py``, an ``arg_groups`` module and a
``dist-info`` RECORD) is asked by a probe that counts its runs in a file, so each test sees
whether the release was really asked or the answer came from the cache.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from factories import release_answers
from factories.release_answers import ask_release, cached_answer, model_directory

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(release_answers.NO_CACHE, raising=False)


def make_release(root: Path, version: str = "9.9.9") -> Path:
    target = root / f"sglang-{version}"
    srt = target / "sglang" / "srt"
    (srt / "arg_groups").mkdir(parents=True)
    (target / "sglang" / "__init__.py").write_text("")
    (srt / "__init__.py").write_text("")
    (srt / "server_args.py").write_text('OPTIONS = ["--port", "--page-size"]\n')
    (srt / "arg_groups" / "__init__.py").write_text("")
    (srt / "arg_groups" / "fields.py").write_text('EXTRA = ["--kv-cache-dtype"]\n')
    for name in (f"sglang-{version}", "numpy-2.0.0"):
        (target / f"{name}.dist-info").mkdir()
        (target / f"{name}.dist-info" / "RECORD").write_text(f"{name}/__init__.py,sha256=x,0\n")
    (target / ".kvgate-complete-0123456789ab").touch()
    return target


class Probe:
    """A probe script that reads the release's options and its stdin, and counts its runs."""

    def __init__(self, root: Path) -> None:
        self.count_file = root / "runs"
        self.script = (
            "import json, sys\n"
            "from sglang.srt import server_args\n"
            "from sglang.srt.arg_groups import fields\n"
            f"open({str(self.count_file)!r}, 'a').write('run\\n')\n"
            "text = sys.stdin.read()\n"
            "asked = json.loads(text) if text else None\n"
            "print('noise before the answer')\n"
            "print('KVGATE-RESULTS ' + json.dumps({'options': server_args.OPTIONS + fields.EXTRA,"
            " 'asked': asked, 'zeta': 1, 'alpha': 2}))\n"
        )

    @property
    def runs(self) -> int:
        return len(self.count_file.read_text().splitlines()) if self.count_file.exists() else 0


@pytest.fixture
def release(tmp_path: Path) -> Path:
    return make_release(tmp_path / "envs")


@pytest.fixture
def probe(tmp_path: Path) -> Probe:
    return Probe(tmp_path)


@pytest.fixture
def answers(tmp_path: Path) -> Path:
    return tmp_path / "answers"


def entries(answers: Path) -> list[Path]:
    return sorted(answers.glob("*.json"))


def test_the_first_ask_runs_the_release_and_a_second_returns_the_stored_answer_without_it(
    release: Path, probe: Probe, answers: Path
) -> None:
    first = ask_release(release, probe.script, [["--port", "1"]], answers=answers)
    assert probe.runs == 1
    assert first == {
        "options": ["--port", "--page-size", "--kv-cache-dtype"],
        "asked": [["--port", "1"]],
        "zeta": 1,
        "alpha": 2,
    }
    [entry] = entries(answers)
    stored = json.loads(entry.read_text())["answer"]

    second = ask_release(release, probe.script, [["--port", "1"]], answers=answers)
    assert probe.runs == 1  # not asked again
    assert second == stored == first
    assert list(second) == ["options", "asked", "zeta", "alpha"]  # the probe's order, kept


def _edit(path: Path, text: str) -> None:
    path.write_text(text)


Change = Callable[[Path, Path, Path], dict[str, Any]]


def _another_version(release: Path, root: Path, config: Path) -> dict[str, Any]:
    (release / "sglang-9.9.9.dist-info").rename(release / "sglang-9.9.10.dist-info")
    return {}


def _server_args_edited(release: Path, root: Path, config: Path) -> dict[str, Any]:
    _edit(release / "sglang/srt/server_args.py", 'OPTIONS = ["--port"]\n')
    return {}


def _arg_groups_edited(release: Path, root: Path, config: Path) -> dict[str, Any]:
    _edit(release / "sglang/srt/arg_groups/fields.py", 'EXTRA = ["--kv-cache-dtypes"]\n')
    return {}


def _a_dependency_reinstalled(release: Path, root: Path, config: Path) -> dict[str, Any]:
    _edit(release / "numpy-2.0.0.dist-info/RECORD", "numpy/__init__.py,sha256=y,1\n")
    return {}


def _setup_script_changed(release: Path, root: Path, config: Path) -> dict[str, Any]:
    (release / ".kvgate-complete-0123456789ab").rename(release / ".kvgate-complete-ba9876543210")
    return {}


def _another_script(release: Path, root: Path, config: Path) -> dict[str, Any]:
    return {"script_suffix": "print('KVGATE-RESULTS 7')\n"}


def _another_argv(release: Path, root: Path, config: Path) -> dict[str, Any]:
    return {"stdin": [["--port", "2"]]}


def _model_config_changed(release: Path, root: Path, config: Path) -> dict[str, Any]:
    _edit(config, '{"max_position_embeddings": 8192}')
    return {}


def _sglang_variable_set(release: Path, root: Path, config: Path) -> dict[str, Any]:
    return {"env": {"SGLANG_KVGATE_TEST_SWITCH": "1"}}


@pytest.mark.parametrize(
    "change",
    [
        _another_version,
        _server_args_edited,
        _arg_groups_edited,
        _a_dependency_reinstalled,
        _setup_script_changed,
        _another_script,
        _another_argv,
        _model_config_changed,
        _sglang_variable_set,
    ],
    ids=lambda change: change.__name__.strip("_"),
)
def test_a_change_to_anything_the_answer_depends_on_asks_the_release_again(
    change: Change,
    release: Path,
    probe: Probe,
    answers: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text('{"max_position_embeddings": 4096}')
    ask: dict[str, Any] = {"stdin": [["--port", "1"]], "script_suffix": "", "env": {}}

    def ask_it() -> Any:
        for name, value in ask["env"].items():
            monkeypatch.setenv(name, value)
        script = probe.script + ask["script_suffix"]
        return ask_release(release, script, ask["stdin"], reads=[config], answers=answers)

    ask_it()
    assert probe.runs == 1
    ask.update(change(release, tmp_path, config))
    changed = ask_it()
    assert probe.runs == 2, "the changed question was answered from the cache"
    assert len(entries(answers)) == 2
    assert ask_it() == changed and probe.runs == 2  # the new answer is cached in turn


def test_variables_sglang_does_not_read_and_the_working_directory_share_one_answer(
    release: Path, probe: Probe, answers: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    ask_release(release, probe.script, answers=answers)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("MAKELEVEL", "1")
    monkeypatch.chdir(tmp_path)
    ask_release(release, probe.script, answers=answers)
    assert probe.runs == 1


def _truncated(entry: Path) -> None:
    entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])


def _not_json(entry: Path) -> None:
    entry.write_text("not json at all")


def _empty(entry: Path) -> None:
    entry.write_text("")


def _answer_altered(entry: Path) -> None:
    stored = json.loads(entry.read_text())
    stored["answer"]["options"] = ["--port"]  # parses, but is not the answer its checksum names
    entry.write_text(json.dumps(stored))


def _another_keys_entry(entry: Path) -> None:
    stored = json.loads(entry.read_text())
    stored["key"] = "0" * 64
    entry.write_text(json.dumps(stored))


def _not_an_entry(entry: Path) -> None:
    entry.write_text('["options"]')


@pytest.mark.parametrize(
    "corrupt",
    [_truncated, _not_json, _empty, _answer_altered, _another_keys_entry, _not_an_entry],
    ids=lambda corrupt: corrupt.__name__.strip("_"),
)
def test_a_corrupt_entry_is_asked_again_and_never_trusted(
    corrupt: Callable[[Path], None], release: Path, probe: Probe, answers: Path
) -> None:
    truth = ask_release(release, probe.script, answers=answers)
    [entry] = entries(answers)
    corrupt(entry)

    assert ask_release(release, probe.script, answers=answers) == truth
    assert probe.runs == 2
    assert ask_release(release, probe.script, answers=answers) == truth
    assert probe.runs == 2  # the entry was written anew


def test_no_cache_asks_the_release_every_time_and_stores_the_fresh_answer(
    release: Path, probe: Probe, answers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ask_release(release, probe.script, answers=answers)
    monkeypatch.setenv(release_answers.NO_CACHE, "1")
    ask_release(release, probe.script, answers=answers)
    ask_release(release, probe.script, answers=answers)
    assert probe.runs == 3
    monkeypatch.delenv(release_answers.NO_CACHE)
    ask_release(release, probe.script, answers=answers)
    assert probe.runs == 3
    assert len(entries(answers)) == 1


def test_a_probe_that_prints_no_answer_fails_and_stores_nothing(
    release: Path, answers: Path
) -> None:
    with pytest.raises(AssertionError, match="did not run"):
        ask_release(release, "import sys; sys.exit(3)", answers=answers)
    assert entries(answers) == []


def _wait_until(condition: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_two_threads_asking_the_same_question_compute_it_once(answers: Path) -> None:
    waiting = threading.Event()
    computed: list[str] = []
    results: dict[str, Any] = {}

    def compute(who: str) -> Callable[[], Any]:
        def run() -> Any:
            computed.append(who)
            if who == "first":
                # Hold the key until the second asker is waiting for it.
                assert waiting.wait(30), "the second asker never waited"
            return {"by": who}

        return run

    def ask(who: str, on_wait: Callable[[], None] | None = None) -> None:
        results[who] = cached_answer(
            {"question": 1}, compute(who), answers=answers, on_wait=on_wait
        )

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    _wait_until(lambda: bool(computed), "the first asker to compute")
    second = threading.Thread(target=ask, args=("second", waiting.set))
    second.start()
    first.join(30)
    second.join(30)
    assert computed == ["first"]
    assert results == {"first": {"by": "first"}, "second": {"by": "first"}}


WORKER = """
import json, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from factories.release_answers import cached_answer

def compute():
    Path({marker!r}).write_text("the second worker computed")
    return {{"by": "second"}}

def waiting():
    Path({waiting!r}).write_text("waiting")

print(json.dumps(cached_answer({{"question": 1}}, compute, answers=Path({answers!r}),
                               on_wait=waiting)))
"""


def test_two_processes_asking_the_same_question_compute_it_once(
    answers: Path, tmp_path: Path
) -> None:
    """As two pytest-xdist workers do: the second waits on the lock, then reads the first's."""
    marker, waiting = tmp_path / "second-computed", tmp_path / "second-waiting"
    script = WORKER.format(
        tests=str(TESTS), marker=str(marker), waiting=str(waiting), answers=str(answers)
    )
    second: list[subprocess.Popen[str]] = []

    def compute() -> Any:
        second.append(
            subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        )
        _wait_until(waiting.exists, "the second worker to wait for the lock")
        return {"by": "first"}

    assert cached_answer({"question": 1}, compute, answers=answers) == {"by": "first"}
    out, _ = second[0].communicate(timeout=60)
    assert second[0].returncode == 0
    assert json.loads(out) == {"by": "first"}
    assert not marker.exists()


def test_a_waiter_gives_up_at_its_deadline_when_the_holder_never_finishes(
    answers: Path,
) -> None:
    holding = threading.Event()
    release_it = threading.Event()

    def hold() -> Any:
        holding.set()
        assert release_it.wait(30)
        return 1

    holder = threading.Thread(
        target=cached_answer, args=({"q": 1}, hold), kwargs={"answers": answers}
    )
    holder.start()
    try:
        assert holding.wait(30)
        with pytest.raises(TimeoutError, match="held for over"):
            cached_answer({"q": 1}, lambda: 2, answers=answers, deadline_s=0.2)
    finally:
        release_it.set()
        holder.join(30)
    assert cached_answer({"q": 1}, lambda: 2, answers=answers) == 1


def test_the_model_directory_is_named_by_its_config_and_holds_exactly_it(tmp_path: Path) -> None:
    config = {"max_position_embeddings": 4096, "architectures": ["LlamaForCausalLM"]}
    directory = model_directory(config, tmp_path)
    assert model_directory(dict(reversed(config.items())), tmp_path) == directory
    assert [p.name for p in directory.iterdir()] == ["config.json"]
    assert json.loads((directory / "config.json").read_text()) == config

    (directory / "config.json").write_text("{}")  # tampered with: written back
    assert model_directory(config, tmp_path) == directory
    assert json.loads((directory / "config.json").read_text()) == config

    other = model_directory({**config, "max_position_embeddings": 8192}, tmp_path)
    assert other != directory
    shutil.rmtree(directory)
    assert model_directory(config, tmp_path) == directory
