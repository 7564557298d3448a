"""Which local program a container image stands for, and with which argv (pure).

No image can be pulled here, so the loopback kubelet maps images to programs in the venv:

* ``lmsysorg/sglang:<tag>`` → ``<venv python> -m kvgate_engine.reference <flags>``: the
  container's ``python3 -m sglang.launch_server`` prefix is dropped and the flags are kept;
  env ``KVGATE_GPU_MEMORY_GIB`` comes from the node, ``KVGATE_ENGINE_VERSION`` from the tag.
  On a node annotated ``e2e.kvgate.io/engine-runtime: sglang-cpu`` it is the released SGLang of
  that tag instead, on CPU, with the same flags (``kvgate_e2e.real_engine``); a tag that names
  no release runs the one the node's ``e2e.kvgate.io/sglang-release`` names. A node annotated
  ``e2e.kvgate.io/engine-args: '["--flag", "value"]'`` appends those flags to every engine it
  starts, last (SGLang keeps the last value): it stands for an engine image whose entrypoint adds
  flags kvgate never passed, which admission cannot see and only the live gate can judge. A node
  annotated ``e2e.kvgate.io/max-total-tokens: N`` appends ``--max-total-tokens N`` after those:
  every engine it starts gets a KV pool of at most N tokens, as on a node with less free GPU
  memory (``kvgate_e2e.kubelet.node.pool_cap``).
* ``*/smg:<tag>`` (``ghcr.io/lightseekorg/smg``) → ``<venv>/bin/smg <args>``.
* a repository whose last path segment ends with ``kvgate`` or ``kvgate-operator`` (the operator)
  → ``<venv>/bin/kvgate``; with no ``command`` the image's ENTRYPOINT ``kvgate operator`` is
  emulated (``operator/Dockerfile``), so the chart's args-only container runs as in a real cluster.
  ``kvgate guard`` (the engine pods' sidecar) reads its engine on the pod's localhost and listens
  on all of the pod's addresses: both become the pod IP (``--engine-host``, ``--host``), since a
  pod here has no localhost of its own.
* anything else → the container's ``command`` + ``args`` exactly as given (so a test can run
  ``python3 -c ...`` in a ``busybox``-named image); a container with no command is refused.

Every program must listen on the pod's own IP, so any ``--host`` flag of the engine and the
gateway is rewritten to the pod IP (and added when missing): in this world all pods share one
network namespace, and ``0.0.0.0`` or ``127.0.0.1`` would collide across pods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvgate_engine.launcher import image_version
from kvgate_engine.reference.main import LOAD_SECONDS

from kvgate_e2e.kubelet.node import pool_cap
from kvgate_e2e.real_engine import (
    RealEngineError,
    node_release,
    real_engine_command,
    uses_real_engine,
)

ENGINE_MODULE = "kvgate_engine.reference"
ENGINE_ARGS_ANNOTATION = "e2e.kvgate.io/engine-args"
SGLANG_ENTRY = ("-m", "sglang.launch_server")
# Seconds an engine of this world waits before it listens (LOAD_SECONDS) unless its pod sets the
# variable, as a real engine loading its weights does (SGLang's tiny CPU model here: 43 s). The
# reference engine alone is up in ~1 s, faster than smg drops a NotReady worker (1.2 s measured):
# a restart would reach traffic in a window no real engine opens (docs/threat-model.md, "An engine
# that restarts slower than the gateway notices").
ENGINE_LOAD_SECONDS = 4.0


class ImageError(ValueError):
    """The container cannot be mapped to a local program."""


@dataclass(frozen=True)
class ImageRef:
    repository: str  # "lmsysorg/sglang", "ghcr.io/lightseekorg/smg"
    tag: str | None
    digest: str | None


@dataclass(frozen=True)
class Launch:
    """A program to run for one container."""

    kind: str  # "engine" | "smg" | "kvgate" | "command"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def parse_image(image: str) -> ImageRef:
    """Split ``registry/repo:tag@digest``; a ``:`` inside the registry host is a port."""
    rest, _, digest = image.partition("@")
    last = rest.rsplit("/", 1)[-1]
    tag: str | None = None
    if ":" in last:
        repo, _, tag = rest.rpartition(":")
    else:
        repo = rest
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/"):
        if repo.startswith(prefix):
            repo = repo[len(prefix) :]
    return ImageRef(repository=repo, tag=tag or None, digest=digest or None)


def image_kind(image: str) -> str:
    repo = parse_image(image).repository
    name = repo.rsplit("/", 1)[-1]
    if repo == "lmsysorg/sglang" or name == "sglang":
        return "engine"
    if name == "smg":
        return "smg"
    if name.endswith("kvgate") or name.endswith("kvgate-operator"):
        return "kvgate"
    return "command"


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion in command/args: defined names are replaced, ``$$`` escapes
    a ``$``, undefined references stay as written (``third_party/forked/golang/expansion``)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    if name in env:
                        out.append(env[name])
                    else:
                        out.append(text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def rewrite_host(args: Sequence[str], pod_ip: str, flag: str = "--host") -> list[str]:
    """Every ``--host X`` / ``--host=X`` becomes the pod IP; added when absent."""
    out: list[str] = []
    seen = False
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag:
            out += [flag, pod_ip]
            seen = True
            skip = i + 1 < len(args)
        elif arg.startswith(flag + "="):
            out.append(f"{flag}={pod_ip}")
            seen = True
        else:
            out.append(arg)
    if not seen:
        out += [flag, pod_ip]
    return out


def _strip_sglang_entry(argv: Sequence[str]) -> list[str]:
    """Drop ``python3 -m sglang.launch_server`` (or ``sglang serve``) in front of the flags."""
    items = list(argv)
    for i in range(len(items) - 1):
        if tuple(items[i : i + 2]) == SGLANG_ENTRY:
            return items[i + 2 :]
    if len(items) >= 2 and Path(items[0]).name == "sglang" and items[1] in ("serve", "launch"):
        return items[2:]
    if items and Path(items[0]).name.startswith("python"):
        raise ImageError(
            f"engine container runs {' '.join(items[:3])!r}; expected "
            "`python3 -m sglang.launch_server <flags>` (set command/args that way)"
        )
    return items


def _strip_program(argv: Sequence[str], program: str) -> list[str]:
    items = list(argv)
    if items and Path(items[0]).name == program:
        return items[1:]
    return items


def launch_for(
    image: str,
    command: Sequence[str],
    args: Sequence[str],
    *,
    pod_ip: str,
    python: str,
    venv_bin: str,
    gpu_memory_gib: float | None,
    env: Mapping[str, str] | None = None,
    node_annotations: Mapping[str, str] | None = None,
) -> Launch:
    """The local program for a container (``command``/``args`` already ``$(VAR)``-expanded);
    ``node_annotations`` (of the pod's node) choose the engine runtime."""
    kind = image_kind(image)
    full = [*command, *args]
    if kind == "engine":
        flags = rewrite_host(_strip_sglang_entry(full), pod_ip)
        flags += node_engine_args(node_annotations or {})
        flags += node_pool_cap(node_annotations or {})
        if node_annotations is not None and uses_real_engine(node_annotations):
            try:
                release = node_release(image_version(image), node_annotations)
                real_argv, real_env = real_engine_command(
                    flags, release, python=python, pod_ip=pod_ip
                )
            except RealEngineError as exc:
                raise ImageError(str(exc)) from exc
            return Launch(kind, real_argv, real_env)
        extra: dict[str, str] = {}
        if gpu_memory_gib is not None:
            extra["KVGATE_GPU_MEMORY_GIB"] = _format_gib(gpu_memory_gib)
        version = image_version(image)
        if version is not None:
            extra["KVGATE_ENGINE_VERSION"] = version
        if LOAD_SECONDS not in (env or {}):
            extra[LOAD_SECONDS] = str(ENGINE_LOAD_SECONDS)
        return Launch(kind, (python, "-m", ENGINE_MODULE, *flags), extra)
    if kind == "smg":
        rest = rewrite_host(_strip_program(full, "smg"), pod_ip)
        if not any(a == "--prometheus-host" or a.startswith("--prometheus-host=") for a in rest):
            # smg's metrics listener defaults to 0.0.0.0:29000, which collides across pods here.
            rest += ["--prometheus-host", pod_ip]
        return Launch(kind, (f"{venv_bin}/smg", *rest))
    if kind == "kvgate":
        if not command and (not args or args[0] != "operator"):
            full = ["kvgate", "operator", *args]  # the operator image's ENTRYPOINT
        rest = _strip_program(full, "kvgate")
        if rest[:1] == ["guard"]:
            rest = rewrite_host(rewrite_host(rest, pod_ip, "--engine-host"), pod_ip)
        return Launch(kind, (f"{venv_bin}/kvgate", *rest))
    if not full:
        raise ImageError(
            f"image {image!r} is not one the loopback kubelet knows (lmsysorg/sglang, smg, "
            "kvgate) and the container has no command: set `command` to a local program"
        )
    return Launch(kind, tuple(full))


def node_engine_args(node_annotations: Mapping[str, str]) -> list[str]:
    """The flags the node's ``e2e.kvgate.io/engine-args`` annotation adds to every engine."""
    raw = node_annotations.get(ENGINE_ARGS_ANNOTATION)
    if raw is None:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ImageError(
            f"node annotation {ENGINE_ARGS_ANNOTATION}={raw!r}: expected a JSON list of "
            'strings, e.g. ["--context-length", "131072"]'
        )
    return list(value)


def node_pool_cap(node_annotations: Mapping[str, str]) -> list[str]:
    """``--max-total-tokens N`` from the node's ``e2e.kvgate.io/max-total-tokens``, if set."""
    try:
        cap = pool_cap(node_annotations)
    except ValueError as exc:
        raise ImageError(str(exc)) from exc
    return [] if cap is None else ["--max-total-tokens", str(cap)]


def _format_gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
