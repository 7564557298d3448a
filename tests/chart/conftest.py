"""The real helm, shared by every chart test module."""

from __future__ import annotations

import os

import pytest
from helm_runner import MISSING_HELM, Helm, find_helm


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = find_helm()
    if binary is None:
        if os.environ.get("CI"):  # `make test` builds helm first; in CI its absence is a failure
            pytest.fail(MISSING_HELM)
        pytest.skip(MISSING_HELM)
    return Helm(binary, home=tmp_path_factory.mktemp("helm-home"))
