"""The committed CRD is exactly what the API models generate, and it is structural."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kvgate.gen.crd import crd, render, render_scale, scale_crd

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "modeldeployment.yaml"


def test_kvgate_crd_output_matches_committed_file_byte_for_byte() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvgate.cmd.cli", "crd"], check=True, capture_output=True, text=True
    ).stdout
    assert out == COMMITTED.read_text(), "crds/ drifted from the API models: run `make crds`"
    assert render() == out


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node; `default` values are data, not schema, so they are not walked."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            if key != "default":
                found.extend(_walk(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_walk(value, f"{path}[{i}]"))
    return found


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_schema_has_nothing_the_api_server_rejects() -> None:
    for path, node in _walk(_schema()):
        if path.endswith(".properties") or path.endswith("x-kubernetes-validations"):
            continue
        for banned in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title", "uniqueItems"):
            assert banned not in node, f"{banned} at {path}"
        if "properties" in node:
            assert "additionalProperties" not in node, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            if bound in node:
                assert node[bound] is True, f"{bound} must be an OpenAPI v3.0 boolean at {path}"
        if "default" in node:
            assert node["default"] is not None, path


def test_every_schema_node_has_a_type_or_an_extension() -> None:
    for path, node in _walk(_schema()):
        if path.endswith(".properties") or "x-kubernetes-validations" in path:
            continue
        if path.endswith("x-kubernetes-list-map-keys") or not node:
            continue
        if any(k in node for k in ("type", "x-kubernetes-int-or-string")):
            continue
        raise AssertionError(f"untyped schema node at {path}: {node}")


def test_crd_has_status_subresource_printer_columns_and_cel_rules() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Context"] == ".spec.model.contextLength"
    assert columns["Prefill-Pool"] == ".status.prefill.minVerifiedKvPoolTokens"
    assert columns["Decode-Pool"] == ".status.decode.minVerifiedKvPoolTokens"
    assert columns["URL"] == ".status.url"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    rules = [r["rule"] for r in spec["safety"]["x-kubernetes-validations"]]
    assert "self.headroom >= 1.0" in rules
    role_rules = [r["rule"] for r in spec["decode"]["x-kubernetes-validations"]]
    assert any("memFractionStatic" in r for r in role_rules)
    assert "self.replicas >= 0" in role_rules
    conditions = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "conditions"
    ]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert spec["model"]["properties"]["config"]["x-kubernetes-preserve-unknown-fields"] is True


def test_committed_crd_is_valid_yaml_naming_the_group_and_short_name() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    assert doc["metadata"]["name"] == "modeldeployments.kvgate.io"
    # Not `md`: Cluster API's MachineDeployment claims it on every CAPI management cluster.
    assert doc["spec"]["names"]["shortNames"] == ["kvmd"]


def test_both_kinds_are_in_the_kvgate_category_so_kubectl_get_kvgate_lists_them() -> None:
    for path in (COMMITTED, ROOT / "crds" / "rolescale.yaml"):
        names = yaml.safe_load(path.read_text())["spec"]["names"]
        assert names["categories"] == ["kvgate"], path
        assert "md" not in names["shortNames"], path


def test_kvgate_crd_rolescale_output_matches_committed_file_byte_for_byte() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvgate.cmd.cli", "crd", "--kind", "RoleScale"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    committed = ROOT / "crds" / "rolescale.yaml"
    assert out == committed.read_text(), "crds/ drifted from the API models: run `make crds`"
    assert render_scale() == out


def test_rolescale_crd_has_a_scale_subresource_an_hpa_can_drive() -> None:
    version = scale_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for banned in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title"):
            assert banned not in node, f"{banned} at {path}"
    rules = schema["properties"]["spec"]["x-kubernetes-validations"]
    assert {r["rule"] for r in rules} == {
        "self.replicas <= self.maxReplicas",
        "self.replicas >= self.minReplicas",
    }
    assert all("messageExpression" in r for r in rules)


def test_message_expressions_use_format_not_string_concatenation() -> None:
    """The API server prices ``'x' + string(n)`` as an unbounded string and refuses the whole CRD
    (found on the e2e world's kube-apiserver 1.37); ``'%d'.format([n])`` it accepts."""
    for doc in (crd(), scale_crd()):
        found = [n["messageExpression"] for _, n in _walk(doc) if "messageExpression" in n]
        assert found
        for expression in found:
            assert "string(" not in expression and ".format([" in expression, expression
