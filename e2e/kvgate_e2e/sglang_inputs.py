"""What an installed SGLang environment and the Python that runs it contribute to a cache key.

Shared by the caches of what SGLang computes (``kvgate_e2e.content_cache``'s users): the
conformance tier's release answers and the real-engine scenarios' tiny Llama and known answer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvgate_e2e.content_cache import sha256

# Inherited variables SGLang or what it imports may read at start-up (SGLang's own switches,
# Hugging Face, torch, CUDA, mooncake, the dynamic loader, Python itself). Others (the shell's,
# make's, pytest-xdist's worker id) are left out of the keys so that every worker and every way
# of starting a tier shares one entry.
ENV_PREFIXES = (
    "SGLANG",
    "SGL_",
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TOKENIZERS",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "NVIDIA",
    "NCCL",
    "MC_",
    "OMP_",
    "MKL_",
    "LD_",
    "PYTHON",
)

# Asked of an interpreter: its version, its machine, the directories its distributions live in.
# An interpreter started to print a few facts about itself (-I -c): a second or so.
INTERPRETER_TIMEOUT = 60
_INTERPRETER_FACTS = (
    "import json, platform, sys, sysconfig\n"
    "site = {sysconfig.get_paths()[name] for name in ('purelib', 'platlib')}\n"
    "print(json.dumps([sys.version, platform.machine(), sorted(site)]))\n"
)


def sglang_versions(site: Path) -> list[str]:
    """The SGLang versions installed in ``site``, from their ``sglang-<version>.dist-info``."""
    return sorted(
        p.name.removeprefix("sglang-").removesuffix(".dist-info")
        for p in site.glob("sglang-*.dist-info")
    )


def installed_records(site: Path) -> str:
    """The SHA-256 of every ``*.dist-info/RECORD`` in ``site``, which holds pip's SHA-256 of
    every file it installed there: a reinstall or another version of any distribution changes
    it, without reading the thousands of files themselves."""
    records = hashlib.sha256()
    for record in sorted(site.glob("*.dist-info/RECORD")):
        records.update(record.parent.name.encode() + b"\0" + record.read_bytes() + b"\0")
    return records.hexdigest()


@functools.cache
def _interpreter_facts(python: str) -> tuple[str, str, tuple[str, ...]]:
    done = subprocess.run(
        [python, "-I", "-c", _INTERPRETER_FACTS],
        capture_output=True,
        text=True,
        check=True,
        timeout=INTERPRETER_TIMEOUT,
    )
    version, machine, site = json.loads(done.stdout)
    return version, machine, tuple(site)


def interpreter_inputs(env: Mapping[str, str], python: str) -> dict[str, Any]:
    """What the interpreter ``python`` contributes, run with the environment ``env``: its
    version, its machine, the distributions installed beside it by name and version (the
    project's venv brings some of what SGLang loads, such as the CUDA libraries), and the
    variables of ``env`` SGLang may read (``ENV_PREFIXES``)."""
    version, machine, site = _interpreter_facts(python)
    distributions = sorted(
        p.name
        for directory in {Path(d) for d in site}
        for pattern in ("*.dist-info", "*.egg-info")
        for p in directory.glob(pattern)
    )
    return {
        "python": version,
        "machine": machine,
        "site_packages": sha256("\n".join(distributions).encode()),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)},
    }
