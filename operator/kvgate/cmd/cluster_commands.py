"""``kvgate explain``, ``history`` and ``rollback``: a ModelDeployment in a cluster, as kubectl
finds the cluster (``kvgate.kube.cli_access``). Each reads through ``kvgate.kube.md_reads``,
decides with ``kvgate.diagnose`` (pure) and prints; input errors, an unreachable or refusing API
server and a ModelDeployment that does not exist are exit 2 (an InputError).

    kvgate explain NAME [-n NS] [--kubeconfig FILE] [--context CTX] [--gpu-reserve P=GIB] [--json]
    kvgate history NAME [-n NS] [--kubeconfig FILE] [--context CTX] [--json]
    kvgate rollback NAME [--to-revision REV] [-n NS] [--kubeconfig FILE] [--context CTX] [--json]
"""

from __future__ import annotations

import argparse
import re

from kvgate_engine.command_inputs import InputError
from kvgate_engine.command_output import envelope, print_json

from kvgate.admission.gpu_reserve import RESERVE_FLAG, parse_reserve_flags
from kvgate.diagnose.explain import explain, explanation_json, explanation_text
from kvgate.diagnose.history import (
    RollbackPlan,
    history_rows,
    history_text,
    plan_rollback,
    rollback_request,
    row_json,
)
from kvgate.kube.cli_access import ClusterAccess, cluster_access
from kvgate.kube.k8s import KubeApi
from kvgate.kube.md_reads import (
    MdObjects,
    MissingModelDeployment,
    describe_missing,
    read_md,
    request_rollback,
    run_against,
)

EXIT_READY = 0
EXIT_NOT_READY = 1
# Kubernetes object names: a DNS-1123 subdomain (a ModelDeployment's is a DNS-1035 label, which
# is one); namespaces: a DNS-1123 label.
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A revision is 10 hex digits (kvgate.api.revision); a row number of kvgate history is digits.
REVISION = re.compile(r"[0-9a-f]{1,63}")


def _shown(value: str) -> str:
    return ascii(value) if len(value) <= 80 else ascii(value[:80]) + "..."


def _access(args: argparse.Namespace) -> ClusterAccess:
    if not OBJECT_NAME.fullmatch(args.name):
        raise InputError(
            "NAME",
            f"{_shown(args.name)} is not a Kubernetes object name (lowercase letters, digits, "
            "'-' and '.'); give the ModelDeployment's name as `kubectl get kvmd` shows it",
        )
    if args.namespace is not None and not NAMESPACE.fullmatch(args.namespace):
        raise InputError(
            "--namespace",
            f"{_shown(args.namespace)} is not a namespace name (lowercase letters, digits and "
            "'-', at most 63)",
        )
    return cluster_access(
        kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace
    )


def _read(access: ClusterAccess, name: str, *, related: bool) -> MdObjects:
    """The ModelDeployment, with its engine pods and Events when ``related`` (explain)."""
    try:
        return run_against(
            access,
            lambda api: read_md(api, access.namespace, name, pods=related, events=related),
        )
    except MissingModelDeployment:
        raise InputError("NAME", describe_missing(access, access.namespace, name)) from None


def explain_main(args: argparse.Namespace) -> int:
    """0 Ready, 1 not Ready (why, with the numbers and the fix), 2 input or cluster error.
    A shape change is estimated with the reserve admission takes: ``--gpu-reserve`` for a GPU
    product, else the operator's own (chart value, as it wrote it in the status)."""
    try:
        reserves = parse_reserve_flags(getattr(args, "gpu_reserve", None))
    except ValueError as error:
        raise InputError(RESERVE_FLAG, str(error)) from None
    access = _access(args)
    objects = _read(access, args.name, related=True)
    explanation = explain(objects.md, objects.pods, objects.events, reserves)
    code = EXIT_READY if explanation.ready else EXIT_NOT_READY
    if args.json:
        print_json(envelope("explain", code, explanation_json(explanation)))
    else:
        print(explanation_text(explanation))
    return code


def history_main(args: argparse.Namespace) -> int:
    """0 with the revisions printed, 2 input or cluster error."""
    access = _access(args)
    # Only the status: Events are anyone's to write, so they decide no row (diagnose.history).
    objects = _read(access, args.name, related=False)
    rows = history_rows(objects.md)
    status = objects.md.get("status") or {}
    if args.json:
        print_json(
            envelope(
                "history",
                0,
                {
                    "name": args.name,
                    "namespace": access.namespace,
                    "serving_revision": status.get("servingRevision"),
                    "target_revision": status.get("targetRevision"),
                    "revisions": [row_json(row) for row in rows],
                },
            )
        )
    else:
        print(history_text(args.name, rows))
    return 0


def rollback_main(args: argparse.Namespace) -> int:
    """0 asked (or nothing to do), 2 no such revision, a refused one, or an input or cluster
    error. Writes only the kvgate.io/rollback annotation, which the operator acts on."""
    if args.to_revision is not None and not REVISION.fullmatch(args.to_revision):
        raise InputError(
            "--to-revision",
            f"{_shown(args.to_revision)} is neither a revision (hex digits, as kvgate history "
            "shows them) nor a row number of kvgate history",
        )
    access = _access(args)

    async def ask(api: KubeApi) -> RollbackPlan:
        objects = await read_md(api, access.namespace, args.name, pods=False, events=False)
        plan = plan_rollback(objects.md, args.to_revision)
        if plan.revision is not None:
            version = (objects.md.get("metadata") or {}).get("resourceVersion")
            patch = rollback_request(plan.revision, version)
            await request_rollback(api, access.namespace, args.name, patch)
        return plan

    try:
        plan = run_against(access, ask)
    except MissingModelDeployment:
        raise InputError("NAME", describe_missing(access, access.namespace, args.name)) from None
    if plan.problem is not None:
        raise InputError("--to-revision" if args.to_revision is not None else "NAME", plan.problem)
    if plan.revision is None:
        message = f"nothing to roll back: {plan.message}"
    else:
        message = (
            f"asked the operator to roll back {access.namespace}/{args.name} to revision "
            f"{plan.revision} (annotation kvgate.io/rollback): {plan.message}. Follow it with "
            f"`kvgate explain {args.name} -n {access.namespace}`"
        )
    if args.json:
        print_json(
            envelope(
                "rollback",
                0,
                {
                    "name": args.name,
                    "namespace": access.namespace,
                    "revision": plan.revision,
                    "requested": plan.revision is not None,
                    "message": message,
                },
            )
        )
    else:
        print(message)
    return 0
