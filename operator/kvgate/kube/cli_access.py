"""Which cluster, user and namespace the command line's cluster commands use, found as kubectl
finds them, and the errors that name where they came from.

Order: ``--kubeconfig``; else ``$KUBECONFIG`` (several files separated by ``:``, merged as
kubectl merges them); else ``~/.kube/config`` when it exists; else the pod's service account
(in a cluster). ``--context`` picks a context (default: the current one). The namespace is
``-n``, else the context's namespace, else the service account's, else ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate_engine.command_inputs import InputError

from kvgate.admission.documents import MAX_FLOW_NESTING, flow_nesting_exceeded
from kvgate.kube.k8s import SA_DIR, Credentials, in_cluster_credentials, kubeconfig_credentials

DEFAULT_KUBECONFIG = "~/.kube/config"
# A kubeconfig is a few KiB; with hundreds of contexts, a few hundred.
MAX_KUBECONFIG_BYTES = 4 * 2**20
KUBECONFIG_SEPARATOR = os.pathsep


class AccessError(InputError):
    """The cluster cannot be used (exit 2, as any input the command cannot use): ``input`` names
    where its address came from (the flag, the variable or the file), ``message`` what is wrong
    and what to do."""


@dataclass(frozen=True)
class ClusterAccess:
    """Where to send requests, as whom, in which namespace, and what said so."""

    credentials: Credentials
    namespace: str
    source: str  # "kubeconfig /home/u/.kube/config (context kind)", "the in-cluster ..."
    source_input: str  # what an error names: --kubeconfig, KUBECONFIG, a path, in-cluster


def _contexts(config_file: str) -> tuple[list[Mapping[str, Any]], str | None]:
    """The kubeconfig's contexts and the name of its current one."""
    from kubernetes import config

    contexts, current = config.list_kube_config_contexts(config_file)  # type: ignore[no-untyped-call]
    entries = [entry for entry in contexts or [] if isinstance(entry, Mapping)]
    name = current.get("name") if isinstance(current, Mapping) else None
    return entries, str(name) if name else None


def _namespace_of(contexts: list[Mapping[str, Any]], wanted: str | None) -> str | None:
    for entry in contexts:
        if entry.get("name") == wanted:
            details = entry.get("context")
            namespace = details.get("namespace") if isinstance(details, Mapping) else None
            return str(namespace) if namespace else None
    return None


def _check_readable(paths: list[str], input_name: str) -> None:
    """Each file exists, is at most the cap and is UTF-8 text: the loader would otherwise fail
    with an error that does not say which file."""
    for path in paths:
        try:
            with open(os.path.expanduser(path), "rb") as handle:
                data = handle.read(MAX_KUBECONFIG_BYTES + 1)
        except OSError as error:
            raise AccessError(
                input_name, f"cannot read kubeconfig {path}: {error.strerror or error}"
            ) from None
        if len(data) > MAX_KUBECONFIG_BYTES:
            raise AccessError(
                input_name,
                f"kubeconfig {path} is larger than the {MAX_KUBECONFIG_BYTES // 2**20} MiB "
                "kvgate reads; pass a kubeconfig file",
            )
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise AccessError(
                input_name, f"kubeconfig {path} is not UTF-8 text (a binary file?)"
            ) from None
        if not text.strip():
            raise AccessError(input_name, f"kubeconfig {path} is empty")
        if flow_nesting_exceeded(text):
            raise AccessError(
                input_name,
                f"kubeconfig {path} opens more than {MAX_FLOW_NESTING} flow collections ([ or {{) "
                "inside each other, which no kubeconfig does; pass a kubeconfig file",
            )


def _unusable(input_name: str, shown: str, error: Exception) -> AccessError:
    detail = str(error) or type(error).__name__
    return AccessError(
        input_name,
        f"kubeconfig {shown} cannot be used: {detail[:300]}; fix it, pick another context "
        "(--context) or another file (--kubeconfig)",
    )


def _from_kubeconfig(
    config_file: str, input_name: str, context: str | None, namespace: str | None
) -> ClusterAccess:
    paths = [p for p in config_file.split(KUBECONFIG_SEPARATOR) if p]
    if input_name == "KUBECONFIG":
        paths = [p for p in paths if Path(p).expanduser().exists()]
        if not paths:
            raise AccessError(
                input_name,
                f"none of the files in KUBECONFIG ({config_file}) exists; set KUBECONFIG or "
                "pass --kubeconfig",
            )
    _check_readable(paths, input_name)
    joined = KUBECONFIG_SEPARATOR.join(paths)
    shown = ", ".join(paths)
    try:
        contexts, current = _contexts(joined)
    except Exception as error:  # the loader raises whatever a malformed file makes it raise
        raise _unusable(input_name, shown, error) from None
    names = [str(entry.get("name")) for entry in contexts]
    if context is not None and context not in names:
        raise AccessError(
            "--context",
            f"kubeconfig {shown} has no context {context!r}; its contexts: "
            f"{', '.join(names) or 'none'}",
        )
    try:
        credentials = kubeconfig_credentials(joined, context)
    except Exception as error:
        raise _unusable(input_name, shown, error) from None
    found_namespace = namespace or _namespace_of(contexts, context or current)
    where = f"kubeconfig {shown}" + (f" (context {context})" if context else "")
    return ClusterAccess(credentials, found_namespace or "default", where, input_name)


def cluster_access(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClusterAccess:
    """The cluster the command talks to (nothing is sent yet); AccessError when there is none
    or its kubeconfig cannot be used."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return _from_kubeconfig(kubeconfig, "--kubeconfig", context, namespace)
    variable = env.get("KUBECONFIG", "")
    if variable:
        return _from_kubeconfig(variable, "KUBECONFIG", context, namespace)
    default = Path(DEFAULT_KUBECONFIG).expanduser()
    if default.exists():
        return _from_kubeconfig(str(default), str(default), context, namespace)
    credentials = in_cluster_credentials()
    if credentials is None:
        raise AccessError(
            "--kubeconfig",
            f"no cluster to talk to: no --kubeconfig, KUBECONFIG is unset, {default} does not "
            "exist and this is not a pod with a service account; pass --kubeconfig FILE or set "
            "KUBECONFIG",
        )
    if context:
        raise AccessError(
            "--context", "there is no kubeconfig to pick a context from (in-cluster access)"
        )
    try:
        own = (SA_DIR / "namespace").read_text().strip()
    except OSError:
        own = ""
    return ClusterAccess(
        credentials,
        namespace or own or "default",
        "the in-cluster service account",
        "in-cluster",
    )


__all__ = ["AccessError", "ClusterAccess", "cluster_access"]
