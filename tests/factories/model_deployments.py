"""Shared builders of test inputs for the operator tests (plain data)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kvgate.api.models import ModelDeployment, ModelDeploymentSpec

SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"
NOW = datetime(2026, 11, 5, 12, 0, 0, tzinfo=UTC)
MD_UID = "0f6c1e2a-5b7d-4c3e-9a8b-1d2e3f4a5b6c"


def md_doc(**spec_overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"] = {
        "name": "llama",
        "namespace": "models",
        "uid": MD_UID,
        "generation": 1,
    }
    for dotted, value in spec_overrides.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return doc


def make_md(**spec_overrides: Any) -> ModelDeployment:
    return ModelDeployment.model_validate(copy.deepcopy(md_doc(**spec_overrides)))


def spec_of(**overrides: Any) -> ModelDeploymentSpec:
    """The smallest valid spec (model m, 131,072 tokens, SGLang v0.5.23), top-level keys
    replaced by ``overrides``."""
    spec: dict[str, Any] = {
        "model": {"name": "m", "path": "/models/m", "contextLength": 131072},
        "engine": {"image": "lmsysorg/sglang:v0.5.23"},
    }
    spec.update(overrides)
    return ModelDeploymentSpec.model_validate(spec)
