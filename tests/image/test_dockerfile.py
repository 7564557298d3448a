"""operator/Dockerfile makes the image `make image` makes: the same script on the same lock
files for the root filesystem, and the same image configuration; non-root, no secrets, a build
context without local environments. No Docker engine runs here, so this reads the Dockerfile;
the contents are the same by construction (one script), the configuration by this comparison.
Also the lock files' shape and the name the chart deploys by default."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path
from types import ModuleType

import yaml

from .conftest import REPO, makefile_uv

DOCKERFILE = REPO / "operator" / "Dockerfile"
DOCKERIGNORE = REPO / "operator" / "Dockerfile.dockerignore"
CHART = REPO / "charts" / "kvgate"
SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|API_?KEY|PRIVATE|CREDENTIAL", re.I)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or (not raw.strip() and not pending):
            continue
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions(text):
        if word == "FROM":
            result.append([])
        result[-1].append((word, rest))
    return result


def pairs(arguments: str) -> dict[str, str]:
    return dict(token.split("=", 1) for token in shlex.split(arguments))


def final_config(stage: list[tuple[str, str]]) -> dict[str, object]:
    labels: dict[str, str] = {}
    env: dict[str, str] = {}
    config: dict[str, object] = {}
    for word, rest in stage:
        if word == "LABEL":
            labels.update(pairs(rest))
        elif word == "ENV":
            env.update(pairs(rest))
        elif word == "EXPOSE":
            config["ExposedPorts"] = {port: {} for port in rest.split()}
        elif word == "USER":
            config["User"] = rest
        elif word == "WORKDIR":
            config["WorkingDir"] = rest
        elif word == "ENTRYPOINT":
            config["Entrypoint"] = json.loads(rest)
    config["Labels"] = labels
    config["Env"] = [f"{key}={value}" for key, value in env.items()]
    return config


def test_the_dockerfile_states_the_configuration_make_image_writes(image_build: ModuleType) -> None:
    final = stages(DOCKERFILE.read_text())[-1]
    assert final[0] == ("FROM", "scratch"), "the final stage holds nothing but the built rootfs"
    assert [rest for word, rest in final if word == "COPY"] == ["--from=build /rootfs/ /"]
    assert final_config(final) == image_build.CONFIG


def test_the_dockerfile_builds_its_rootfs_with_make_images_script_and_locks(
    image_build: ModuleType,
) -> None:
    build_stage = stages(DOCKERFILE.read_text())[0]
    runs = " ".join(rest for word, rest in build_stage if word == "RUN")
    assert re.search(r"python3 /src/operator/image/build\.py rootfs --out /rootfs", runs)
    # The same uv as `make image`: the Makefile's pinned version.
    assert f"uv=={makefile_uv().parent.parent.name.removeprefix('uv-')}" in runs
    copied = {src for word, rest in build_stage if word == "COPY" for src in rest.split()[:-1]}
    # Everything the script reads: kvgate's sources and the script with its three lock files.
    for needed in (*image_build.SOURCES, "operator/image"):
        assert needed in copied, f"operator/Dockerfile does not COPY {needed}"


def admitted(path: str, rules: list[str]) -> bool:
    """The last matching .dockerignore rule wins; `!` admits."""
    keep = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.removeprefix("!").removesuffix("/**")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or (pattern == "*"):
            keep = negate
    return keep


def test_the_dockerignore_sends_every_input_of_the_build(image_build: ModuleType) -> None:
    rules = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    inputs = [
        image_build.DEBIAN_LOCK,
        image_build.REQUIREMENTS_LOCK,
        image_build.BUILD_CONSTRAINTS_LOCK,
        image_build.HERE / "build.py",
        *image_build.source_files(),
    ]
    refused = [
        p.relative_to(REPO).as_posix()
        for p in inputs
        if not admitted(p.relative_to(REPO).as_posix(), rules)
    ]
    assert refused == []
    assert not admitted(".venv/bin/python", rules)
    assert not admitted("operator/kvgate/__pycache__/x.pyc", rules)


def test_the_locks_pin_every_requirement_with_a_hash(image_build: ModuleType) -> None:
    pins = image_build.lock_pins(image_build.REQUIREMENTS_LOCK)
    declared = re.findall(
        r'^  "([A-Za-z0-9_.-]+)',
        (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0],
        re.M,
    )
    for name in declared:
        assert name.lower() in pins, (
            f"{name} (pyproject's dependencies) is not in requirements.lock"
        )
    assert {"setuptools", "wheel"} <= set(image_build.lock_pins(image_build.BUILD_CONSTRAINTS_LOCK))
    lock = image_build.read_debian_lock()
    names = [p.split("=", 1)[0] for p in lock.packages]
    assert {"python3.11", "ca-certificates", "libc6"} <= set(names)
    assert len(names) == len(set(names)), "a Debian package pinned twice"


def test_a_lock_line_that_is_not_pinned_is_refused_with_the_way_out(
    image_build: ModuleType, tmp_path: Path
) -> None:
    bad = tmp_path / "requirements.lock"
    bad.write_text("kopf>=1.45\n")
    try:
        image_build.lock_pins(bad)
    except image_build.BuildError as error:
        assert "kopf>=1.45" in str(error) and "make image-lock" in str(error)
    else:
        raise AssertionError("an unpinned requirement was accepted")


def test_the_archive_carries_the_tag_the_chart_deploys_by_default(image_build: ModuleType) -> None:
    chart = (REPO / "charts" / "kvgate" / "Chart.yaml").read_text()
    app_version = re.search(r'^appVersion:\s*"?([^"\n]+)"?', chart, re.M)
    assert app_version is not None
    assert image_build._project_version() == app_version.group(1)
    values = (REPO / "charts" / "kvgate" / "values.yaml").read_text()
    assert f"repository: {image_build.DEFAULT_IMAGE}\n" in values


def test_the_final_stage_runs_as_the_uid_the_chart_runs(image_build: ModuleType) -> None:
    user = str(image_build.CONFIG["User"])
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["runAsUser"] == int(uid)
    final = stages(DOCKERFILE.read_text())[-1]
    assert not [rest for word, rest in final if word == "CMD"], "ENTRYPOINT only, no CMD"


def test_the_build_stage_starts_from_the_debian_suite_the_lock_pins(
    image_build: ModuleType,
) -> None:
    first = stages(DOCKERFILE.read_text())[0][0]
    assert first == ("FROM", f"debian:{image_build.read_debian_lock().suite} AS build")


def test_no_secrets_are_baked_into_the_image() -> None:
    for word, rest in instructions(DOCKERFILE.read_text()):
        if word in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*=", rest) or [rest.split()[0]]
            for name in names:
                assert not SECRET_WORDS.search(name), f"{word} {name} looks like a secret"
        if word in ("COPY", "ADD"):
            assert not re.search(
                r"\.env\b|kubeconfig|\.kube|id_rsa|\.pem|\.key|\.netrc|\.pypirc", rest
            ), f"{word} {rest} copies credentials"
        if word == "RUN":
            assert not re.search(r"--password|--token|https?://[^/\s]+:[^@\s]+@", rest)
            assert "[reference" not in rest and "[test" not in rest
        assert word != "ADD" or not rest.startswith("http"), "ADD from a URL"


def test_the_build_context_sends_no_local_environment() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "the ignore file must exclude everything by default"
    allowed = [p for p in patterns if p.startswith("!")]
    assert not any(".venv" in p or ".git" in p or "e2e/.build" in p or "dist" in p for p in allowed)


def test_the_tests_run_the_runtime_dependencies_the_image_ships(image_build: ModuleType) -> None:
    """`make venv` installs with requirements.lock as constraints: a pin that moves reinstalls
    the venv (the lock is part of its stamp), so the tests never run other versions."""
    from importlib.metadata import PackageNotFoundError, version

    moved = {}
    for name, pinned in image_build.lock_pins(image_build.REQUIREMENTS_LOCK).items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "missing"
        if installed != pinned:
            moved[name] = (pinned, installed)
    assert moved == {}, (
        "the venv's versions differ from operator/image/requirements.lock: make venv"
    )


def test_a_lock_refresh_that_changes_no_package_changes_no_byte(image_build: ModuleType) -> None:
    """`make image-lock` keeps the Debian lock's epoch (the layer's file times) unless the
    package list moved, so the Debian layer keeps its digest across refreshes."""
    lock = image_build.read_debian_lock()
    same = image_build.debian_lock_text(lock, list(reversed(lock.packages)), now=lock.epoch + 99)
    assert same == image_build.DEBIAN_LOCK.read_text()
    moved = [p for p in lock.packages if not p.startswith("tar=")] + ["tar=1.35+dfsg-3"]
    changed = image_build.debian_lock_text(lock, moved, now=lock.epoch + 99)
    assert f"epoch {lock.epoch + 99}\n" in changed and "package tar=1.35+dfsg-3\n" in changed


def test_the_archive_cache_keeps_the_three_most_recently_used(
    image_build: ModuleType, tmp_path: Path
) -> None:
    """Each commit is a new epoch and so a new 76 MiB archive: the cache keeps three."""
    import os

    for age, key in enumerate(["newest", "second", "third", "fourth", "fifth"]):
        (tmp_path / key).mkdir()
        os.utime(tmp_path / key, (1_000_000 - age, 1_000_000 - age))
    removed = image_build.prune_archives(tmp_path)
    assert sorted(p.name for p in removed) == ["fifth", "fourth"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newest", "second", "third"]


def test_the_image_declares_the_packages_license_and_carries_its_text(
    image_build: ModuleType,
) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    labels = image_build.CONFIG["Labels"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert "LICENSE" in image_build.SOURCES  # the kvgate wheel in the image carries the text
