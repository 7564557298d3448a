"""The API models accept good ModelDeployments and name the field in every error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate.api.models import KvCacheDtype, ModelDeployment
from pydantic import ValidationError

SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"


def sample() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    return doc


def test_sample_parses_with_defaults_filled_in() -> None:
    md = ModelDeployment.model_validate(sample())
    assert md.spec.model.context_length == 131072
    assert md.spec.engine.kv_cache_dtype is KvCacheDtype.AUTO
    assert md.spec.router.replicas == 1
    assert md.spec.rollout.scale_down_refused is True
    assert md.spec.safety.kv_checksum is True


def test_minimal_document_needs_only_model_and_engine_image() -> None:
    doc = {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": {
            "model": {"name": "m", "path": "/m", "contextLength": 4096},
            "engine": {"image": "lmsysorg/sglang:v0.5.23"},
        },
    }
    md = ModelDeployment.model_validate(doc)
    assert md.spec.prefill.mem_fraction_static == 0.85
    assert md.spec.safety.headroom == 1.0
    assert md.spec.safety.min_engine_version == "0.5.22"


def _mutate(path: list[str], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(sample())
    node = doc["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["model", "contextLength"], 0, "model.contextLength"),
        (["model", "contextLength"], "lots", "model.contextLength"),
        (["model", "name"], _DELETE, "model.name"),
        (["engine", "image"], _DELETE, "engine.image"),
        (["engine", "kvCacheDtype"], "int3", "engine.kvCacheDtype"),
        (["engine", "transferBackend"], "carrier-pigeon", "engine.transferBackend"),
        (["engine", "pageSize"], 0, "engine.pageSize"),
        (["safety", "headroom"], 0.9, "safety.headroom"),
        (["prefill", "memFractionStatic"], 1.0, "prefill.memFractionStatic"),
        (["decode", "memFractionStatic"], 0, "decode.memFractionStatic"),
        (["decode", "replicas"], -1, "decode.replicas"),
        (["prefill", "tensorParallel"], 0, "prefill.tensorParallel"),
        (["decode", "gpuMemoryGiB"], -80, "decode.gpuMemoryGiB"),
        (["model", "contextLenght"], 4096, "model.contextLenght"),
    ],
)
def test_bad_document_error_names_the_field(path: list[str], value: Any, field: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        ModelDeployment.model_validate(_mutate(path, value))
    locations = [".".join(str(p) for p in err["loc"]) for err in excinfo.value.errors()]
    assert any(loc.startswith("spec." + field) for loc in locations), locations
