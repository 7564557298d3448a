"""`kvgate validate FILE [--json] [--min-version-floor VERSION]`: the webhook's checks, offline.

Exit 0 when every document in FILE is allowed (warnings are printed), 1 when any is denied or
FILE cannot be read, 2 when --min-version-floor is not a version. Every problem is printed, with
its field and numbers. --min-version-floor is the cluster's chart value engineVersionFloor: with
it, the answers are the ones that cluster's webhook gives.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import yaml

from kvgate.admission.checks import check_document
from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import AdmissionResult, Problem

EXIT_ALLOWED = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    with open(source, encoding="utf-8") as handle:
        return handle.read()


def load_documents(text: str) -> list[Any]:
    """Every YAML (or JSON) document in `text`, skipping empty ones (`---` at the end)."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _name(document: Any, index: int) -> str:
    if isinstance(document, dict):
        metadata = document.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
            return f"{document.get('kind', 'document')}/{metadata['name']}"
    return f"document {index + 1}"


def _print_text(out: TextIO, name: str, result: AdmissionResult) -> None:
    verdict = "allowed" if result.allowed else "denied"
    out.write(f"{name}: {verdict}\n")
    for denial in result.denials:
        out.write(f"  error: {denial}\n")
    for warning in result.warnings:
        out.write(f"  warning: {warning}\n")


def main(args: argparse.Namespace) -> int:
    """Check FILE; print every denial and warning; exit 0 allowed, 1 denied."""
    out = sys.stdout
    try:
        policy = ClusterPolicy(min_engine_version_floor=getattr(args, "min_version_floor", None))
    except ValueError as error:
        sys.stderr.write(f"kvgate validate: --min-version-floor: {error}\n")
        return EXIT_USAGE
    try:
        policy = ClusterPolicy(
            min_engine_version_floor=policy.min_engine_version_floor,
            gpus_per_node=getattr(args, "gpus_per_node", None),
        )
    except ValueError as error:
        sys.stderr.write(f"kvgate validate: --gpus-per-node: {error}\n")
        return EXIT_USAGE
    try:
        documents = load_documents(_read(args.file))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as error:
        result = AdmissionResult(
            denials=(Problem("", f"cannot read {args.file}: {error}; pass a YAML or JSON file"),)
        )
        named = [(args.file, result)]
    else:
        if not documents:
            empty = Problem("", f"{args.file} holds no document; pass a ModelDeployment")
            named = [(args.file, AdmissionResult(denials=(empty,)))]
        else:
            named = [
                (_name(doc, i), check_document(doc, policy)) for i, doc in enumerate(documents)
            ]

    if args.json:
        payload = {
            "allowed": all(result.allowed for _, result in named),
            "documents": [{"name": name, **result.as_dict()} for name, result in named],
        }
        out.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    else:
        for name, result in named:
            _print_text(out, name, result)
    return EXIT_ALLOWED if all(result.allowed for _, result in named) else EXIT_DENIED
