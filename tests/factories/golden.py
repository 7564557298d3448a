"""The operator's golden files (tests/golden/operator/): a builder's output, compared as YAML.
``KVGATE_UPDATE_GOLDEN=1`` writes them anew (review the diff)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "operator"
UPDATE = os.environ.get("KVGATE_UPDATE_GOLDEN") == "1"


def check_golden(name: str, body: Any) -> None:
    """``body`` equals ``tests/golden/operator/<name>.yaml``."""
    path = GOLDEN / f"{name}.yaml"
    text = yaml.safe_dump(body, sort_keys=True, allow_unicode=True)
    if UPDATE or not path.exists():
        assert UPDATE, f"{path} is missing; run with KVGATE_UPDATE_GOLDEN=1 to create it"
        path.write_text(text)
    assert yaml.safe_load(path.read_text()) == yaml.safe_load(text), (
        f"{path.name} differs from the builder output; if intended, rerun with "
        "KVGATE_UPDATE_GOLDEN=1 and review the diff"
    )
