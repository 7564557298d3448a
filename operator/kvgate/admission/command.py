"""`kvgate validate FILE [--json] [--min-version-floor VERSION] [--gpus-per-node N]`: the
webhook's checks, offline.

Exit 0 when every document in FILE is allowed (warnings and each role's estimated pool are
printed), 1 when any is denied (every problem, with its field and numbers), 2 when FILE cannot be
read as YAML or JSON within the webhook's 1 MiB (:mod:`kvgate.admission.documents`) or a flag is
not usable. --min-version-floor is the cluster's chart value engineVersionFloor and
--gpus-per-node its gpusPerNode: with them, the answers are the ones that cluster's webhook gives.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from kvgate_engine.command_inputs import InputError
from kvgate_engine.command_output import envelope, print_json

from kvgate.admission.checks import RoleEstimate, check_document, role_estimates
from kvgate.admission.documents import load_manifests
from kvgate.admission.gpu_reserve import RESERVE_FLAG, parse_reserve_flags
from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import AdmissionResult

EXIT_ALLOWED = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


def _name(document: Any, index: int) -> str:
    if isinstance(document, dict):
        metadata = document.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
            return f"{document.get('kind', 'document')}/{metadata['name']}"
    return f"document {index + 1}"


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


def _policy(args: argparse.Namespace) -> ClusterPolicy:
    floor = getattr(args, "min_version_floor", None)
    try:
        ClusterPolicy(min_engine_version_floor=floor)
    except ValueError as error:
        raise InputError("--min-version-floor", str(error)) from None
    try:
        reserves = parse_reserve_flags(getattr(args, "gpu_reserve", None))
    except ValueError as error:
        raise InputError(RESERVE_FLAG, str(error)) from None
    try:
        return ClusterPolicy(
            min_engine_version_floor=floor,
            gpus_per_node=getattr(args, "gpus_per_node", None),
            gpu_reserved_gib_by_product=reserves,
        )
    except ValueError as error:
        raise InputError("--gpus-per-node", str(error)) from None


def main(args: argparse.Namespace) -> int:
    """Check FILE; print every denial, estimate and warning; exit 0 allowed, 1 denied (an
    unusable FILE or flag raises InputError: exit 2)."""
    policy = _policy(args)
    documents = load_manifests(args.file, input_name=args.file)
    checked = []
    for index, document in enumerate(documents):
        result = check_document(document, policy)
        estimates = role_estimates(document, policy) if result.allowed else []
        checked.append((_name(document, index), result, estimates))
    allowed = all(result.allowed for _, result, _ in checked)
    code = EXIT_ALLOWED if allowed else EXIT_DENIED
    if args.json:
        payload = {
            "allowed": allowed,
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
        for name, result, estimates in checked:
            _print_text(sys.stdout, name, result, estimates)
    return code
