"""Every one-shot ``kvgate`` command over malformed input: a message naming the input, an exit
code from the documented set, in seconds of CPU, and never a traceback.

The corpus: binary, empty, huge (above the cap the command reads), infinite, NaN, negative, zero
and absurd numbers, YAML alias bombs and recursive aliases, wrong kinds (a list where an object
belongs, a Pod where a ModelDeployment belongs), deep nesting, and unicode in file names, flags and
contents. Each case runs in-process through ``kvgate.cmd.cli.main`` (text and ``--json``), and a
sample through the installed ``kvgate`` script in a subprocess with a deadline and a memory cap.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories.model_configs import model_config
from kvgate.cmd.cli import main

ROOT = Path(__file__).resolve().parents[2]
KVGATE = Path(sys.executable).parent / "kvgate"
SAMPLE_MD = ROOT / "crds" / "samples" / "llama-8b.yaml"
ENGINE_FIXTURES = ROOT / "tests" / "fixtures" / "engine"
SERVER_INFO = ENGINE_FIXTURES / "server_info_0.5.23_decode.json"
MODELS = ENGINE_FIXTURES / "models_131072.json"

# What each command may exit with (its --help and docs/operating.md say the same): 0 yes,
# 1 the command's "no", 2 an input or usage error (or, for verify, "could not tell"). 3, an
# internal error, is documented too, but no input in this corpus may reach it.
DOCUMENTED = {
    "validate": {0, 1, 2},
    "estimate": {0, 1, 2},
    "verify": {0, 1, 2},
    "plan": {0, 1, 2},
    "explain": {0, 1, 2},
    "history": {0, 2},
    "rollback": {0, 2},
}
# CPU seconds of one in-process command: what a pathological input costs (a parser whose work
# grows with the square of the input), not the machine's load. Wall time is bounded by the
# subprocess sample's deadline; a loaded run measured 10.7 s of wall for 1.7 s of CPU here.
IN_PROCESS_CPU_SECONDS = 5.0
SUBPROCESS_SECONDS = 60.0
SUBPROCESS_MEMORY_BYTES = 2 * 2**30
BIGGER_THAN_EVERY_CAP = 5 * 2**20  # the largest cap is 4 MiB (a saved /server_info)


@dataclass(frozen=True)
class Case:
    """One command line, the exit codes it may end with, and the input its message names."""

    id: str
    argv: tuple[str, ...]
    codes: frozenset[int]
    names: str = ""  # must appear in stderr (text) and in error.input (--json) on exit 2

    @property
    def command(self) -> str:
        return self.argv[0]


# --------------------------------------------------------------------------------------------
# The corpus files, written once per module
# --------------------------------------------------------------------------------------------


def _billion_laughs(levels: int, root: str) -> str:
    """Nine levels of ten aliases: 10^9 strings once expanded, a few hundred bytes as text."""
    lines = [
        "x-anchors:",
        '  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for level in range(1, levels):
        lines.append(f"  a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n" + root.replace("{bomb}", f"*a{levels - 1}")


def _write_corpus(directory: Path) -> dict[str, Path]:
    rng = random.Random(33)
    sample = SAMPLE_MD.read_text()
    llama = model_config("llama-3.1-8b")
    files: dict[str, bytes | str] = {
        "config.json": json.dumps(llama),
        "md.yaml": sample,
        "binary.bin": rng.randbytes(4096),
        "nul.json": b'{"hidden_size": "\x00\x01\x02"}',
        "utf16.json": json.dumps(llama).encode("utf-16"),
        "latin1.json": '{"architectures": ["Llamé"]}'.encode("latin-1"),
        "empty": b"",
        "blank": " \n\t\n",
        "huge.json": b'{"pad": "' + b"x" * BIGGER_THAN_EVERY_CAP + b'"}',
        "huge.yaml": b"# " + b"x" * BIGGER_THAN_EVERY_CAP + b"\n" + sample.encode(),
        "many-values.json": "[" + "0," * 400_000 + "0]",
        "deep.json": "[" * 50_000 + "]" * 50_000,
        "deep.yaml": "a: " + "[" * 5_000 + "]" * 5_000 + "\n",
        "bigint.json": '{"num_hidden_layers": 1' + "0" * 5_000 + "}",
        "nan.json": json.dumps({**llama, "hidden_size": float("nan")}),
        "inf.json": json.dumps({**llama, "num_hidden_layers": float("inf")}),
        "list.json": "[1, 2, 3]",
        "string.json": '"config"',
        "number.json": "42",
        "null.json": "null",
        "negative.json": json.dumps({**llama, "num_hidden_layers": -32, "hidden_size": -4096}),
        "zero.json": json.dumps({**llama, "num_attention_heads": 0, "num_key_value_heads": 0}),
        "unicode-keys.json": json.dumps(
            {**llama, "architectures": ["Модель🙂ForCausalLM"], "ключ": "значение ✓"},
            ensure_ascii=False,
        ),
        "配置 🙂.json": json.dumps(llama),
        "bomb.yaml": _billion_laughs(9, sample.replace("torch_dtype: bfloat16", "bomb: {bomb}")),
        "bomb-small.yaml": _billion_laughs(
            6, sample.replace("torch_dtype: bfloat16", "torch_dtype: bfloat16\n      x: {bomb}")
        ),
        "recursive.yaml": "apiVersion: kvgate.io/v1alpha1\nkind: ModelDeployment\n"
        "metadata: {name: loop}\nspec: &spec\n  model: {name: m, path: /m, contextLength: 8, "
        "config: *spec}\n",
        "python-tag.yaml": "!!python/object/apply:os.system ['true']\n",
        "pod.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
        "  - {name: c, image: busybox}\n",
        "list.yaml": "- just\n- a list\n",
        "scalar.yaml": "hello\n",
        "tabs.yaml": "apiVersion:\tkvgate.io/v1alpha1\n\tkind: [\n",
        "inf-md.yaml": sample.replace("headroom: 1.0", "headroom: .inf"),
        "nan-md.yaml": sample.replace("gpuMemoryGiB: 80", "gpuMemoryGiB: .nan"),
        "huge-gpu-md.yaml": sample.replace("gpuMemoryGiB: 80", "gpuMemoryGiB: 1.0e+25"),
        # What the cluster refuses or prunes, so validate must too (issue 47 item 2).
        "snake-case-md.yaml": sample.replace("contextLength: 131072", "context_length: 131072"),
        "toleration-md.yaml": sample.replace(
            "    gpuMemoryGiB: 80\n  rollout:",
            "    gpuMemoryGiB: 80\n    tolerations: [{key: gpu, operator: Exist}]\n  rollout:",
        ),
        "quantity-md.yaml": sample.replace(
            "    gpuMemoryGiB: 80\n  rollout:",
            "    gpuMemoryGiB: 80\n    resources: {limits: {memory: 64GB!}}\n  rollout:",
        ),
        "fp16-md.yaml": sample.replace("kvCacheDtype: auto", "kvCacheDtype: fp16"),
        "old-floor-md.yaml": sample.replace(
            'minEngineVersion: "0.5.22"', 'minEngineVersion: "0.5.1"'
        ),
        "pvc-and-md.yaml": "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: w}\n"
        "spec: {accessModes: [ReadOnlyMany], resources: {requests: {storage: 1Ti}}}\n---\n"
        + sample,
        "unicode-md.yaml": sample.replace("name: llama-8b", "name: ламa-∞-🙂").replace(
            "llama-3.1-8b            #", "модель-✓ #"
        ),
        "server-info-list.json": "[]",
        "models-string.json": '"models"',
        # A kubeconfig whose API server nobody answers at (the discard port, closed).
        "unreachable.kubeconfig": "apiVersion: v1\nkind: Config\nclusters:\n"
        "- {name: c, cluster: {server: 'http://127.0.0.1:9'}}\nusers:\n- {name: u, user: {}}\n"
        "contexts:\n- {name: ctx, context: {cluster: c, user: u}}\ncurrent-context: ctx\n",
    }
    paths = {}
    for name, content in files.items():
        path = directory / name
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        paths[name] = path
    directory.joinpath("a-directory").mkdir()
    paths["a-directory"] = directory / "a-directory"
    paths["missing"] = directory / "missing.json"
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _write_corpus(tmp_path_factory.mktemp("corpus"))


# --------------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------------

BAD_JSON_FILES = (
    "binary.bin",
    "nul.json",
    "utf16.json",
    "latin1.json",
    "empty",
    "blank",
    "huge.json",
    "many-values.json",
    "deep.json",
    "bigint.json",
    "nan.json",
    "list.json",
    "string.json",
    "number.json",
    "null.json",
    "a-directory",
    "missing",
)
BAD_MANIFEST_FILES = (
    "binary.bin",
    "utf16.json",
    "latin1.json",
    "empty",
    "blank",
    "huge.yaml",
    "deep.yaml",
    "bomb.yaml",
    "bomb-small.yaml",
    "recursive.yaml",
    "python-tag.yaml",
    "tabs.yaml",
    "a-directory",
    "missing",
)
NON_FINITE = ("inf", "-inf", "nan", "1e309")
ESTIMATE = ("estimate", "--config", "{config.json}", "--gpu-memory-gib", "80", "--tp", "1")
ESTIMATE_WEIGHTS = (*ESTIMATE, "--weights-gib", "15")
PLAN = ("plan", "--config", "{config.json}", "--weights-gib", "15")
VERIFY = ("verify", "--server-info", str(SERVER_INFO), "--context-length", "131072")


def _cases() -> list[Case]:
    two, domain = frozenset({2}), frozenset({0, 1})
    cases: list[Case] = []

    def add(case_id: str, argv: tuple[str, ...], codes: frozenset[int], names: str = "") -> None:
        cases.append(Case(case_id, argv, codes, names))

    # Files that are not what the flag reads.
    for name in BAD_JSON_FILES:
        add(
            f"estimate-config-{name}",
            ("estimate", "--config", f"{{{name}}}", "--gpu-memory-gib", "80", "--tp", "1"),
            two,
            "--config",
        )
        add(f"plan-config-{name}", ("plan", "--config", f"{{{name}}}"), two, "--config")
        add(
            f"verify-server-info-{name}",
            ("verify", "--server-info", f"{{{name}}}", "--context-length", "131072"),
            two,
            "--server-info",
        )
        add(f"verify-models-{name}", (*VERIFY, "--models", f"{{{name}}}"), two, "--models")
    for name in ("inf.json", "negative.json", "zero.json"):
        add(
            f"estimate-config-{name}",
            (*ESTIMATE_WEIGHTS[:2], f"{{{name}}}", *ESTIMATE_WEIGHTS[3:]),
            two,
            "--config",
        )
        add(
            f"plan-config-{name}",
            ("plan", "--config", f"{{{name}}}", "--weights-gib", "15"),
            two,
            "--config",
        )
    add(
        "verify-server-info-a-list",
        ("verify", "--server-info", "{server-info-list.json}", "--context-length", "8"),
        two,
        "--server-info",
    )
    add("verify-models-a-string", (*VERIFY, "--models", "{models-string.json}"), two, "--models")
    for name in BAD_MANIFEST_FILES:
        add(f"validate-{name}", ("validate", f"{{{name}}}"), two, f"{{{name}}}")
        add(f"plan-f-{name}", ("plan", "-f", f"{{{name}}}"), two, "-f")
    # A file of other kinds only: nothing for validate to check (other kinds beside a
    # ModelDeployment are skipped with a note), an input error for plan -f.
    add("validate-pod.yaml", ("validate", "{pod.yaml}"), two, "{pod.yaml}")
    add("plan-f-pod.yaml", ("plan", "-f", "{pod.yaml}"), two, "-f")
    # Documents that are not objects of a kind, or broken ModelDeployments: admission's "no" for
    # validate, an input error for plan -f.
    for name in (
        "list.yaml",
        "scalar.yaml",
        "inf-md.yaml",
        "nan-md.yaml",
        "huge-gpu-md.yaml",
    ):
        add(f"validate-{name}", ("validate", f"{{{name}}}"), frozenset({1}))
        add(f"plan-f-{name}", ("plan", "-f", f"{{{name}}}"), two, "-f")
    add("validate-unicode-md", ("validate", "{unicode-md.yaml}"), frozenset({1}))
    for name in (
        "snake-case-md.yaml",
        "toleration-md.yaml",
        "quantity-md.yaml",
        "fp16-md.yaml",
        "old-floor-md.yaml",
    ):
        add(f"validate-{name}", ("validate", f"{{{name}}}"), frozenset({1}))
    # Another kind beside a ModelDeployment (kustomize build output) is skipped, not denied.
    add("validate-pvc-and-md", ("validate", "{pvc-and-md.yaml}"), frozenset({0}))
    add("plan-f-unicode-md", ("plan", "-f", "{unicode-md.yaml}"), frozenset({0, 1, 2}))
    add(
        "estimate-unicode-file-name",
        (*ESTIMATE_WEIGHTS[:2], "{配置 🙂.json}", *ESTIMATE_WEIGHTS[3:]),
        frozenset({0}),
    )
    add(
        "estimate-unicode-keys",
        (*ESTIMATE_WEIGHTS[:2], "{unicode-keys.json}", *ESTIMATE_WEIGHTS[3:]),
        frozenset({0}),
    )
    add(
        "plan-unicode-keys",
        ("plan", "--config", "{unicode-keys.json}", "--weights-gib", "15"),
        domain,
    )

    # Numbers: non-finite, negative, zero, absurd.
    for flag in (
        "--gpu-memory-gib",
        "--mem-fraction-static",
        "--weights-gib",
        "--gpu-reserved-gib",
    ):
        base = [*ESTIMATE_WEIGHTS]
        if flag in base:
            index = base.index(flag)
            del base[index : index + 2]
        for value in (*NON_FINITE, "-1"):
            add(f"estimate{flag}={value}", (*base, flag, value), two, flag)
    for value in ("0", "1e25", "16385"):
        add(
            f"estimate--gpu-memory-gib={value}",
            (
                "estimate",
                "--config",
                "{config.json}",
                "--tp",
                "1",
                "--weights-gib",
                "15",
                "--gpu-memory-gib",
                value,
            ),
            two,
            "--gpu-memory-gib",
        )
    for value in ("0", "1", "1.5"):
        add(
            f"estimate--mem-fraction-static={value}",
            (*ESTIMATE_WEIGHTS, "--mem-fraction-static", value),
            two,
            "--mem-fraction-static",
        )
    add("estimate--weights-gib=0", (*ESTIMATE, "--weights-gib", "0"), two, "--weights-gib")
    add("estimate--weights-gib=1e25", (*ESTIMATE, "--weights-gib", "1e25"), frozenset({1}))
    add(
        "estimate--gpu-reserved-gib=80",
        (*ESTIMATE_WEIGHTS, "--gpu-reserved-gib", "80"),
        two,
        "--gpu-reserved-gib",
    )
    for value in ("0", "-1", "513", "1000000", "9" * 30):
        add(
            f"estimate--tp={value}",
            (
                "estimate",
                "--config",
                "{config.json}",
                "--gpu-memory-gib",
                "80",
                "--weights-gib",
                "15",
                "--tp",
                value,
            ),
            two,
            "--tp",
        )
    add(
        "estimate--tp=3",
        (
            "estimate",
            "--config",
            "{config.json}",
            "--gpu-memory-gib",
            "80",
            "--weights-gib",
            "15",
            "--tp",
            "3",
        ),
        two,
        "--tp",
    )
    for value in ("0", "-1", "1.5", "x"):
        add(
            f"estimate--page-size={value}",
            (*ESTIMATE_WEIGHTS, "--page-size", value),
            two,
            "--page-size",
        )
        add(
            f"estimate--max-total-tokens={value}",
            (*ESTIMATE_WEIGHTS, "--max-total-tokens", value),
            two,
            "--max-total-tokens",
        )
    add("estimate--page-size=huge", (*ESTIMATE_WEIGHTS, "--page-size", "9" * 30), frozenset({1}))
    for value in ("float16", "fp16", "half", "fp8_e4m3\u200b", "🙂", ""):
        add(
            f"estimate--kv-cache-dtype={value!r}",
            (*ESTIMATE_WEIGHTS, "--kv-cache-dtype", value),
            two,
            "--kv-cache-dtype",
        )
    for value in ("sm٩٠", "sm_9000", "🙂"):
        add(
            f"estimate--gpu-arch={value}",
            (*ESTIMATE_WEIGHTS, "--gpu-arch", value),
            frozenset({0, 2}),
            "--gpu-arch",
        )
    for value in ("--speculative-algorithm=NEXTN🙂", "--dp-size=0", "--swa-full-tokens-ratio=nan"):
        add(
            f"estimate--engine-arg={value}",
            (*ESTIMATE_WEIGHTS, f"--engine-arg={value}"),
            frozenset({0, 2}),
            "--engine-arg",
        )

    for value in (*NON_FINITE, "-1", "0", "0.5", "1e308"):
        add(f"verify--headroom={value}", (*VERIFY, "--headroom", value), two, "--headroom")
    add("verify--headroom=1e25", (*VERIFY, "--headroom", "1e25"), frozenset({1}))
    for value in ("0", "-1", "1" + "0" * 400, "1.5"):
        add(
            f"verify--context-length={value[:8]}",
            ("verify", "--server-info", str(SERVER_INFO), "--context-length", value),
            two,
            "--context-length",
        )
    for value in ("not-a-version", "🙂", ""):
        add(
            f"verify--min-version={value!r}",
            (*VERIFY, "--min-version", value),
            two,
            "--min-version",
        )
    for value in (*NON_FINITE, "0", "-1", "1e9"):
        add(
            f"verify--timeout={value}",
            ("verify", "--url", "http://127.0.0.1:9", "--context-length", "8", "--timeout", value),
            two,
            "--timeout",
        )
    add(
        "verify--url-not-a-url",
        ("verify", "--url", "not a url ✓", "--context-length", "8", "--timeout", "1"),
        two,
        "--url",
    )
    add(
        "verify--models-with-url",
        ("verify", "--url", "http://127.0.0.1:9", "--models", str(MODELS), "--context-length", "8"),
        two,
        "--models",
    )
    add("verify--api-key-offline", (*VERIFY, "--api-key", "k"), two, "--api-key")

    for flag in (
        "--gpu-memory-gib",
        "--headroom",
        "--weights-gib",
        "--mem-fraction-static",
        "--gpu-reserved-gib",
    ):
        for value in (*NON_FINITE, "-1"):
            add(
                f"plan{flag}={value}",
                (*PLAN, flag, value)
                if flag != "--weights-gib"
                else ("plan", "--config", "{config.json}", flag, value),
                two,
                flag,
            )
    for value in ("0", "1e25", "16385"):
        add(
            f"plan--gpu-memory-gib={value}",
            (*PLAN, "--gpu-memory-gib", value),
            two,
            "--gpu-memory-gib",
        )
    add(
        "plan--gpu-memory-gib=1e25-qwen",
        (
            "plan",
            "--config",
            str(ROOT / "tests/fixtures/model_configs/qwen3-4b.json"),
            "--weights-gib",
            "8",
            "--gpu-memory-gib",
            "1e25",
        ),
        two,
        "--gpu-memory-gib",
    )
    add("plan--headroom=1e25", (*PLAN, "--headroom", "1e25"), domain)
    add(
        "plan--headroom=1e308-context",
        (*PLAN, "--headroom", "1e308", "--context-length", "131072"),
        two,
        "--headroom",
    )
    add(
        "plan--weights-gib=1e25",
        ("plan", "--config", "{config.json}", "--weights-gib", "1e25"),
        frozenset({1}),
    )
    for value in ("0", "-1", "1000000", "x", ","):
        add(f"plan--tp={value}", (*PLAN, "--tp", value), two, "--tp")
    for value in ("0", "-1"):
        add(f"plan--page-size={value}", (*PLAN, "--page-size", value), two, "--page-size")
        add(
            f"plan--context-length={value}",
            (*PLAN, "--context-length", value),
            two,
            "--context-length",
        )
    for value in ("float16", "🙂", ","):
        add(
            f"plan--kv-cache-dtype={value}",
            (*PLAN, "--kv-cache-dtype", value),
            two,
            "--kv-cache-dtype",
        )
    add("plan-f-with-search-flag", ("plan", "-f", "{md.yaml}", "--tp", "1"), two)
    add("plan-nothing", ("plan",), two)

    for value in ("0", "-1", "x", "9" * 30):
        codes = frozenset({0, 2}) if value.startswith("9") else two
        add(
            f"validate--gpus-per-node={value}",
            ("validate", "{md.yaml}", "--gpus-per-node", value),
            codes,
            "--gpus-per-node",
        )
    for value in ("x", "🙂", ""):
        add(
            f"validate--min-version-floor={value!r}",
            ("validate", "{md.yaml}", "--min-version-floor", value),
            two,
            "--min-version-floor",
        )

    # The cluster commands: kubeconfigs that cannot be used, names that are not names, an API
    # server nobody answers at.
    unreachable = ("--kubeconfig", "{unreachable.kubeconfig}")
    for command in ("explain", "history", "rollback"):
        for name in (
            "binary.bin",
            "empty",
            "blank",
            "huge.json",
            "list.yaml",
            "scalar.yaml",
            "bomb-small.yaml",
            "deep.yaml",
            "a-directory",
            "missing",
        ):
            add(
                f"{command}-kubeconfig-{name}",
                (command, "llama", "--kubeconfig", f"{{{name}}}"),
                two,
                "--kubeconfig",
            )
        add(f"{command}-unreachable", (command, "llama", *unreachable), two, "--kubeconfig")
        add(
            f"{command}-context-unknown",
            (command, "llama", *unreachable, "--context", "nope🙂"),
            two,
            "--context",
        )
        for value in ("🙂", "Llama", "a/b", "x" * 300, "-", "llama,x=y"):
            add(f"{command}-name={value[:8]!r}", (command, value, *unreachable), two, "NAME")
        for value in ("🙂", "A_B", "x" * 64):
            add(
                f"{command}-namespace={value[:8]!r}",
                (command, "llama", "-n", value, *unreachable),
                two,
                "--namespace",
            )
    for value in ("🙂", "", "a" * 64, "HEAD~1", "1.5"):
        add(
            f"rollback--to-revision={value[:8]!r}",
            ("rollback", "llama", "--to-revision", value, *unreachable),
            two,
            "--to-revision",
        )
    add("explain-no-name", ("explain",), two)
    return cases


CASES = _cases()


def _argv(case: Case, files: dict[str, Path]) -> list[str]:
    """The command line with ``{name}`` replaced by the corpus file's path."""
    return [
        str(files[arg[1:-1]]) if arg.startswith("{") and arg.endswith("}") else arg
        for arg in case.argv
    ]


def _named(case: Case, files: dict[str, Path]) -> str:
    if case.names.startswith("{") and case.names.endswith("}"):
        return str(files[case.names[1:-1]])
    return case.names


def _run_in_process(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str, float]:
    started = time.process_time()
    code = main(argv)
    cpu = time.process_time() - started
    out, err = capsys.readouterr()
    return code, out, err, cpu


def _assert_documented(case: Case, code: int, err: str, cpu: float) -> None:
    assert "Traceback" not in err, err
    assert code in DOCUMENTED[case.command], (code, err)
    assert code in case.codes, (code, err[-2000:])
    assert cpu < IN_PROCESS_CPU_SECONDS, f"{cpu:.1f} s of CPU"


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_gets_a_message_and_a_documented_exit_code(
    case: Case, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err, cpu = _run_in_process(_argv(case, corpus), capsys)
    _assert_documented(case, code, err, cpu)
    if code == 2:
        assert err.strip(), "an input error must say what is wrong"
        assert _named(case, corpus) in err, err
        if case.names:  # an input error: the message on stderr, nothing on stdout
            assert out == "", out
        assert len(err.splitlines()) <= 20, err


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_with_json_prints_one_object_with_the_schema_version(
    case: Case, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err, cpu = _run_in_process([*_argv(case, corpus), "--json"], capsys)
    _assert_documented(case, code, err, cpu)
    payload: dict[str, Any] = json.loads(out)  # exactly one JSON document
    assert payload["schemaVersion"] == 1
    assert payload["command"] == case.command
    assert payload["exit_code"] == code
    if code == 2 and "error" in payload and payload["error"] is not None:
        assert set(payload["error"]) == {"input", "message"}
        assert _named(case, corpus) in payload["error"]["input"], payload
        assert payload["error"]["message"]


# --------------------------------------------------------------------------------------------
# The installed script, in a subprocess: the exit status, stderr and a deadline as a user sees them
# --------------------------------------------------------------------------------------------

SUBPROCESS_CASES = [
    case
    for case in CASES
    if case.id
    in {
        "estimate-config-binary.bin",
        "estimate-config-huge.json",
        "verify-server-info-binary.bin",
        "verify-models-binary.bin",
        "plan-config-binary.bin",
        "validate-bomb.yaml",
        "plan-f-bomb.yaml",
        "validate-recursive.yaml",
        "validate-deep.yaml",
        "estimate--gpu-memory-gib=inf",
        "verify--headroom=inf",
        "plan--gpu-memory-gib=1e25-qwen",
        "estimate--tp=1000000",
        "explain-kubeconfig-binary.bin",
        "history-unreachable",
        "rollback--to-revision='🙂'",
    }
]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_MEMORY_BYTES, SUBPROCESS_MEMORY_BYTES))


def _kvgate(
    argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(KVGATE), *argv],
        capture_output=True,
        timeout=SUBPROCESS_SECONDS,
        preexec_fn=_limit_memory,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_subprocess_sample_covers_every_command() -> None:
    assert {case.command for case in SUBPROCESS_CASES} == set(DOCUMENTED)
    assert len(SUBPROCESS_CASES) == 16


@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=[case.id for case in SUBPROCESS_CASES])
def test_the_installed_script_exits_2_without_a_traceback(
    case: Case, corpus: dict[str, Path]
) -> None:
    started = time.monotonic()
    done = _kvgate(_argv(case, corpus))
    elapsed = time.monotonic() - started
    err = done.stderr.decode("utf-8", "replace")
    assert b"Traceback" not in done.stderr, err
    assert done.returncode == 2, (done.returncode, err[-2000:])
    assert _named(case, corpus) in err, err
    assert elapsed < SUBPROCESS_SECONDS


def test_a_file_name_that_is_not_utf8_is_named_without_a_traceback(tmp_path: Path) -> None:
    """argv bytes that are not UTF-8 reach Python as lone surrogates; printing them must not
    crash the output (text or JSON)."""
    name = os.fsencode(str(tmp_path)) + b"/\xff\xfe.yaml"
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [os.fsencode(str(KVGATE)), b"validate", name, *[x.encode() for x in extra]],
            capture_output=True,
            timeout=SUBPROCESS_SECONDS,
            check=False,
        )
        assert b"Traceback" not in done.stderr, done.stderr
        assert done.returncode == 2
        if extra:
            assert json.loads(done.stdout)["error"]["input"]


def test_output_to_an_ascii_terminal_does_not_crash(tmp_path: Path) -> None:
    """The messages use ×, − and ≥; a terminal that cannot show them gets escapes, not a crash."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(model_config("llama-3.1-8b")))
    done = _kvgate(
        ["estimate", "--config", str(config), "--gpu-memory-gib", "24", "--tp", "1"],
        env={"PYTHONIOENCODING": "ascii"},
    )
    assert b"Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0
    assert b"KV pool" in done.stdout


def test_an_unexpected_failure_is_one_line_and_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The last resort: a kvgate bug is reported as one line naming it, with its own exit code."""
    import kvgate.cmd.crd_command as crd_command

    def broken() -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(crd_command, "render", broken)
    assert main(["crd"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "kvgate crd: internal error (RuntimeError: boom); this is a kvgate bug: please report "
        "it with the command line\n"
    )


def test_every_one_shot_command_documents_its_exit_codes_in_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("validate", "estimate", "verify", "plan"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "exit codes:" in text, command
        for code in (0, 1, 2, 3):
            assert f"{code} " in text.split("exit codes:")[1], (command, code)


def test_output_cut_short_by_its_reader_is_not_reported_as_a_bug() -> None:
    """`kvgate plan ... | head -1`: the reader went away; exit 141 (SIGPIPE), no message."""
    config = ROOT / "tests" / "golden" / "plan" / "llama-3.1-70b-config.json"
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe fails: its reader is gone
    try:
        done = subprocess.run(
            [str(KVGATE), "plan", "--config", str(config), "--weights-gib", "131.5"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=SUBPROCESS_SECONDS,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, b"")
