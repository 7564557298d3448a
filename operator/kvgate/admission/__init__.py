"""Admission: the checks that deny unsafe ModelDeployments before any GPU is spent.

`checks` is pure and shared by `kvgate validate` (`command`) and the validating webhook
(`answer`, served by `app`: `kvgate webhook`, or inside `kvgate operator`). Importing this package
does not import kopf.
"""

from kvgate.admission.checks import check_document, check_update
from kvgate.admission.result import AdmissionResult, Problem

__all__ = ["AdmissionResult", "Problem", "check_document", "check_update"]
