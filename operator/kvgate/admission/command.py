"""`kvgate validate FILE [--json] [--min-version-floor VERSION] [--gpus-per-node N]
[--model-host-path-prefix DIR ...]`: the webhook's checks, offline.

Exit 0 when every document in FILE is allowed (warnings and each role's estimated pool are
printed), 1 when any is denied (every problem, with its field and numbers), 2 when FILE cannot be
read as YAML or JSON within the webhook's 1 MiB (:mod:`kvgate.admission.documents`) or a flag is
not usable. --min-version-floor is the cluster's chart value engineVersionFloor (default: the
chart's default, so that the answers are a default install's; `none` for no floor) and
--gpus-per-node its gpusPerNode, --model-host-path-prefix an entry of its hostPaths.modelPrefixes
(the RDMA device directory is the chart's default, /dev/infiniband): with them, the answers are
the ones that cluster's webhook gives.
Documents of other kinds (a PVC beside the ModelDeployment, `kustomize build` output) are skipped
with a note; keys are read by the CRD's camelCase names only, as the API server reads them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from kvgate_engine.command_inputs import InputError
from kvgate_engine.command_output import envelope, print_json

from kvgate.admission.checks import RoleEstimate, check_document, role_estimates
from kvgate.admission.documents import document_name, load_manifests
from kvgate.admission.gpu_reserve import RESERVE_FLAG, parse_reserve_flags
from kvgate.admission.host_paths import HostPathPolicy
from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import AdmissionResult

# The chart's default engineVersionFloor (charts/kvgate/values.yaml; a test keeps them equal):
# what a default install's webhook denies below.
CHART_ENGINE_VERSION_FLOOR = "0.5.22"

EXIT_ALLOWED = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


def _other_kind(document: Any) -> str | None:
    """The kind of a Kubernetes object that is not a ModelDeployment (skipped, as the webhook
    never sees it), or None for a ModelDeployment or anything that is not an object with a kind
    (checked, and denied as not a ModelDeployment)."""
    if not isinstance(document, dict):
        return None
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str) or not kind:
        return None
    return None if kind == "ModelDeployment" else kind


def _print_text(
    out: TextIO, name: str, result: AdmissionResult, estimates: list[RoleEstimate]
) -> None:
    verdict = "allowed" if result.allowed else "denied"
    out.write(f"{name}: {verdict}\n")
    for denial in result.denials:
        out.write(f"  error: {denial}\n")
    for estimate in estimates:
        out.write(f"  estimate: {estimate.describe()}\n")
    for warning in result.warnings:
        out.write(f"  warning: {warning}\n")


def _floor(args: argparse.Namespace) -> str | None:
    """--min-version-floor: the chart's default floor when not given (what a default install's
    webhook denies), none for no cluster floor."""
    floor = getattr(args, "min_version_floor", None)
    if floor is None:
        return CHART_ENGINE_VERSION_FLOOR
    return None if floor.strip().lower() == "none" else floor


def _floor_note(floor: str | None, given: bool) -> str:
    if floor is None:
        return "no engine version floor (--min-version-floor none)"
    if given:
        return f"engine version floor {floor} (--min-version-floor)"
    return (
        f"engine version floor {floor} (the chart's default engineVersionFloor; "
        "--min-version-floor VERSION for your cluster's, none for no floor)"
    )


def _policy(args: argparse.Namespace) -> ClusterPolicy:
    floor = _floor(args)
    try:
        ClusterPolicy(min_engine_version_floor=floor)
    except ValueError as error:
        raise InputError("--min-version-floor", str(error)) from None
    try:
        reserves = parse_reserve_flags(getattr(args, "gpu_reserve", None))
    except ValueError as error:
        raise InputError(RESERVE_FLAG, str(error)) from None
    try:
        host_paths = HostPathPolicy(
            model_prefixes=tuple(getattr(args, "model_host_path_prefix", None) or ())
        )
    except ValueError as error:
        raise InputError("--model-host-path-prefix", str(error)) from None
    try:
        return ClusterPolicy(
            min_engine_version_floor=floor,
            gpus_per_node=getattr(args, "gpus_per_node", None),
            gpu_reserved_gib_by_product=reserves,
            host_paths=host_paths,
        )
    except ValueError as error:
        raise InputError("--gpus-per-node", str(error)) from None


def main(args: argparse.Namespace) -> int:
    """Check FILE; print every denial, estimate and warning; exit 0 allowed, 1 denied (an
    unusable FILE or flag raises InputError: exit 2)."""
    policy = _policy(args)
    floor_note = _floor_note(policy.min_engine_version_floor, args.min_version_floor is not None)
    documents = load_manifests(args.file, input_name=args.file)
    checked = []
    skipped = []
    for index, document in enumerate(documents):
        other = _other_kind(document)
        if other is not None:
            skipped.append({"name": document_name(document, index), "kind": other})
            continue
        result = check_document(document, policy)
        estimates = role_estimates(document, policy) if result.allowed else []
        checked.append((document_name(document, index), result, estimates))
    if not checked:
        names = ", ".join(entry["name"] for entry in skipped)
        raise InputError(
            args.file,
            f"holds no ModelDeployment (skipped {len(skipped)} document(s) of other kinds: "
            f"{names}); pass a file with a ModelDeployment",
        )
    allowed = all(result.allowed for _, result, _ in checked)
    code = EXIT_ALLOWED if allowed else EXIT_DENIED
    if args.json:
        payload = {
            "allowed": allowed,
            "engineVersionFloor": policy.min_engine_version_floor,
            "skipped": skipped,
            "documents": [
                {
                    "name": name,
                    **result.as_dict(),
                    "estimates": [estimate.as_dict() for estimate in estimates],
                }
                for name, result, estimates in checked
            ],
        }
        print_json(envelope("validate", code, payload), sort_keys=False)
    else:
        sys.stdout.write(f"checked against the {floor_note}\n")
        for entry in skipped:
            sys.stdout.write(
                f"{entry['name']}: skipped (not a ModelDeployment; the webhook checks only "
                "ModelDeployments)\n"
            )
        for name, result, estimates in checked:
            _print_text(sys.stdout, name, result, estimates)
    return code
