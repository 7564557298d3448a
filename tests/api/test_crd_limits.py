"""The CRD carries the input limits, so the API server refuses what exceeds them even without the
webhook; `model.config`'s size bound is the webhook's (the CRD cannot express it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kvgate.api import models as api

COMMITTED = Path(__file__).resolve().parents[2] / "crds" / "modeldeployment.yaml"


def _root() -> dict[str, Any]:
    doc = yaml.safe_load(COMMITTED.read_text())
    root: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def _at(path: str) -> dict[str, Any]:
    node = _root()["properties"]["spec"]
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def test_committed_crd_bounds_numbers_lists_and_strings() -> None:
    for role in ("prefill", "decode"):
        assert _at(f"{role}.replicas")["maximum"] == api.MAX_ENGINE_REPLICAS
        assert _at(f"{role}.tensorParallel")["maximum"] == api.MAX_TENSOR_PARALLEL
        assert _at(f"{role}.tolerations")["maxItems"] == api.MAX_TOLERATIONS
        assert _at(f"{role}.nodeSelector")["maxProperties"] == api.MAX_NODE_SELECTOR
        assert _at(f"{role}.nodeSelector")["additionalProperties"]["maxLength"] == 63
    assert _at("router.replicas")["maximum"] == api.MAX_ROUTER_REPLICAS
    for path in ("router.args", "engine.args", "engine.env"):
        assert _at(path)["maxItems"] == api.MAX_ARGS
    for path in ("router.args.[]", "engine.args.[]", "engine.env.[].value"):
        assert _at(path)["maxLength"] == api.MAX_ARG_LENGTH
    for path in ("model.name", "model.path", "engine.image", "router.image"):
        assert 1 <= _at(path)["maxLength"] <= api.MAX_PATH_LENGTH
    assert _at("safety.minEngineVersion")["maxLength"] == api.MAX_VERSION_LENGTH
    assert _at("engine.port")["maximum"] == 65535
    assert _at("rollout.reverifyIntervalSeconds")["maximum"] == api.MAX_REVERIFY_INTERVAL_SECONDS
    assert _at("rollout.verifyTimeoutSeconds")["maximum"] == api.MAX_VERIFY_TIMEOUT_SECONDS


def test_every_spec_string_and_list_has_a_bound_except_free_form_objects() -> None:
    """A new field without a limit fails here (free-form maps are bounded by the size check)."""

    def walk(node: dict[str, Any], path: str) -> list[str]:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return []  # model.config, affinity, valueFrom: the admission size check bounds them
        unbounded = []
        kind = node.get("type")
        if kind == "string" and "maxLength" not in node and "enum" not in node:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
        for name, sub in node.get("properties", {}).items():
            unbounded += walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            unbounded += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            unbounded += walk(node["additionalProperties"], f"{path}{{}}")
        return unbounded

    assert walk(_root()["properties"]["spec"], "spec") == []


def test_name_rule_is_checked_by_the_api_server_on_create_only() -> None:
    name = _root()["properties"]["metadata"]["properties"]["name"]
    (rule,) = name["x-kubernetes-validations"]
    assert rule["optionalOldSelf"] is True  # an old object stays updatable (finalizers)
    assert rule["rule"].startswith("oldSelf.hasValue() || ")
    assert "size(self) <= 63" in rule["rule"]
    assert "DNS-1035" in rule["message"]


def test_model_config_stays_free_form_and_its_size_is_bounded_at_admission() -> None:
    config = _at("model.config")
    assert config["x-kubernetes-preserve-unknown-fields"] is True
    assert "96 KiB" in config["description"]
