"""Admission: the checks that deny unsafe ModelDeployments before any GPU is spent.

Pure: `checks` is shared by `kvgate validate` (`command`) and the validating webhook (`answer`,
served by :mod:`kvgate.webhook`: `kvgate webhook`, or inside `kvgate operator`). Nothing here
imports asyncio, aiohttp, kopf or the I/O folders.
"""

from kvgate.admission.checks import check_document, check_update
from kvgate.admission.result import AdmissionResult, Problem

__all__ = ["AdmissionResult", "Problem", "check_document", "check_update"]
