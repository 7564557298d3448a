"""The published Hugging Face config.json files in tests/fixtures/model_configs/, each read
fresh (a test may change its copy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"


def model_config(name: str) -> dict[str, Any]:
    """``tests/fixtures/model_configs/<name>.json``, e.g. ``model_config("llama-3.1-8b")``."""
    config: dict[str, Any] = json.loads((MODEL_CONFIGS / f"{name}.json").read_text())
    return config
