"""`kvgate crd`: print the CRD generated from the API models."""

from __future__ import annotations

import argparse
import sys

from kvgate.gen.crd import render


def main(args: argparse.Namespace) -> int:
    sys.stdout.write(render())
    return 0
