"""`kvgate crd`: print a CRD generated from the API models (ModelDeployment, or RoleScale)."""

from __future__ import annotations

import argparse
import sys

from kvgate.gen.crd import render, render_scale


def main(args: argparse.Namespace) -> int:
    sys.stdout.write(render_scale() if getattr(args, "kind", None) == "RoleScale" else render())
    return 0
