"""docs/autoscaling.md against what it describes: its HPAs are valid autoscaling/v2 (field by field,
as the Kubernetes client's generated models define the API) and target the RoleScale kvgate
generates, within the bounds of its ModelDeployment excerpt, which admission admits; every Pods
metric an HPA names is served by a prometheus-adapter rule; every recording rule it names is one
the chart records; every SGLang metric its signal table lists is exported by the reference
engine."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kvgate.admission import check_document

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "autoscaling.md").read_text()
BLOCKS = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S)]
ROLESCALE_CRD = yaml.safe_load((ROOT / "crds" / "rolescale.yaml").read_text())
RULES_TEMPLATE = (ROOT / "charts" / "kvgate" / "templates" / "prometheusrule.yaml").read_text()
ADAPTER_FILE = ROOT / "docs" / "autoscaling" / "prometheus-adapter-rules.yaml"


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [b for b in BLOCKS if isinstance(b, dict) and b.get("kind") == kind]


def excerpt() -> dict[str, Any]:
    (block,) = [b for b in BLOCKS if isinstance(b, dict) and "spec" in b and "kind" not in b]
    return block


def unknown_fields(value: Any, type_name: str, path: str) -> list[str]:
    """Fields of ``value`` that the Kubernetes API type ``type_name`` does not have."""
    if type_name.lower().startswith("list["):
        return [
            error
            for index, item in enumerate(value)
            for error in unknown_fields(item, type_name[5:-1], f"{path}[{index}]")
        ]
    if type_name.lower().startswith(("dict(", "dict[")) or type_name in (
        "object",
        "str",
        "int",
        "bool",
        "float",
    ):
        return []
    model = getattr(kubernetes.client, type_name)
    by_json = {json: attr for attr, json in model.attribute_map.items()}
    errors = []
    for key, item in value.items():
        if key not in by_json:
            errors.append(f"{path}.{key} is not a field of {type_name}")
        else:
            errors += unknown_fields(item, model.openapi_types[by_json[key]], f"{path}.{key}")
    return errors


def test_the_doc_has_an_hpa_per_role_and_a_keda_scaled_object() -> None:
    assert sorted(
        h["spec"]["scaleTargetRef"]["name"] for h in of_kind("HorizontalPodAutoscaler")
    ) == [
        "llama-8b-decode",
        "llama-8b-prefill",
    ]
    assert of_kind("ScaledObject")


@pytest.mark.parametrize(
    "hpa", of_kind("HorizontalPodAutoscaler"), ids=lambda h: h["metadata"]["name"]
)
def test_each_hpa_is_autoscaling_v2_field_by_field(hpa: dict[str, Any]) -> None:
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert unknown_fields(hpa, "V2HorizontalPodAutoscaler", "") == []


def test_the_field_check_catches_a_misspelt_field() -> None:
    (hpa, *_) = of_kind("HorizontalPodAutoscaler")
    wrong = copy.deepcopy(hpa)
    wrong["spec"]["metrics"][0]["pods"]["target"]["averageValues"] = "1"
    assert unknown_fields(wrong, "V2HorizontalPodAutoscaler", "") == [
        ".spec.metrics[0].pods.target.averageValues is not a field of V2MetricTarget"
    ]


def test_every_scale_target_is_a_rolescale_within_its_roles_bounds() -> None:
    version = ROLESCALE_CRD["spec"]["versions"][0]["name"]
    api_version = f"{ROLESCALE_CRD['spec']['group']}/{version}"
    spec = excerpt()["spec"]
    targets = [
        (h["spec"], "minReplicas", "maxReplicas") for h in of_kind("HorizontalPodAutoscaler")
    ]
    targets += [(s["spec"], "minReplicaCount", "maxReplicaCount") for s in of_kind("ScaledObject")]
    for target, low, high in targets:
        ref = target["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"]) == (api_version, "RoleScale")
        role = ref["name"].removeprefix("llama-8b-")
        bounds = spec[role]["autoscaling"]
        assert bounds["minReplicas"] <= target[low] <= target[high] <= bounds["maxReplicas"]


def test_the_model_deployment_excerpt_is_admitted_and_min_above_max_is_denied_as_quoted() -> None:
    sample = yaml.safe_load((ROOT / "crds" / "samples" / "llama-8b.yaml").read_text())
    for role in ("prefill", "decode"):
        sample["spec"][role] |= excerpt()["spec"][role]
    sample["spec"]["prefillPerDecode"] = excerpt()["spec"]["prefillPerDecode"]
    assert check_document(sample).allowed
    sample["spec"]["decode"]["autoscaling"]["minReplicas"] = 9
    denied = check_document(sample)
    assert not denied.allowed
    assert f"`{denied.message}`" in DOC


def served_custom_metrics() -> set[str]:
    """Names prometheus-adapter would serve, from the doc's rules and the e2e world's file,
    over the series the chart records and the SGLang gauges."""
    series = set(re.findall(r"- record: (\S+)", RULES_TEMPLATE))
    series |= {f"sglang:{name}" for name in re.findall(r"^\| `(\w+)` \|", DOC, flags=re.M)}
    rules = [r for b in BLOCKS if isinstance(b, dict) and "rules" in b for r in b["rules"]]
    rules += yaml.safe_load(ADAPTER_FILE.read_text())["rules"]
    served = set()
    for rule in rules:
        naming = rule.get("name", {"matches": "^(.*)$", "as": "${1}"})
        query = rule["seriesQuery"]
        pattern = re.search(r'__name__=~"([^"]+)"', query)
        regex = pattern.group(1) if pattern else re.escape(query.split("{")[0])
        for name in series:
            if re.fullmatch(regex, name):
                served.add(re.sub(naming["matches"], naming["as"].replace("${1}", r"\1"), name))
    return served


def test_every_hpa_pods_metric_is_served_by_an_adapter_rule() -> None:
    wanted = {
        metric["pods"]["metric"]["name"]
        for hpa in of_kind("HorizontalPodAutoscaler")
        for metric in hpa["spec"]["metrics"]
    }
    assert wanted <= served_custom_metrics()


def test_every_recording_rule_the_doc_names_is_one_the_chart_records() -> None:
    named = set(re.findall(r"namespace_deployment(?:_pod)?(?:_role)?:\w+:\w+", DOC))
    recorded = set(re.findall(r"- record: (\S+)", RULES_TEMPLATE))
    assert named and named <= recorded, sorted(named - recorded)


def test_every_sglang_metric_in_the_signal_table_is_exported_by_the_reference_engine() -> None:
    from kvgate_engine.reference.args import DEFAULT_VERSION, parse_launch_args
    from kvgate_engine.reference.engine import EngineSettings, ReferenceEngine
    from kvgate_engine.reference.main import startup_limits
    from kvgate_engine.reference.metrics import SGLangCollector

    names = re.findall(r"^\| `(\w+)` \|", DOC, flags=re.M)
    assert len(names) >= 10
    exported: set[str] = set()
    for role in ("prefill", "decode"):
        launch = parse_launch_args(["--model-path", "tiny-llama"], DEFAULT_VERSION)
        model, limits = startup_limits(launch, {}, DEFAULT_VERSION)
        settings = EngineSettings(role, DEFAULT_VERSION, False, False, model.vocab_size)
        collector = SGLangCollector(ReferenceEngine(settings, limits), "tiny")
        exported |= {family.name for family in collector.collect()}
    assert {f"sglang:{name}" for name in names} <= exported


def cel_message(rule: dict[str, Any], values: dict[str, Any]) -> str:
    """A CRD rule's messageExpression ``'...'.format([self.a, ...])`` for these field values."""
    match = re.fullmatch(r"'(.*)'\.format\(\[(.*)\]\)", rule["messageExpression"], flags=re.S)
    assert match, rule["messageExpression"]
    template, args = match.groups()
    fields = [arg.strip().removeprefix("self.") for arg in args.split(",")]
    return template % tuple(values[field] for field in fields)


def test_the_quoted_rolescale_refusal_is_the_crds_message() -> None:
    schema = ROLESCALE_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema["properties"]["spec"]["x-kubernetes-validations"]
    (above,) = [r for r in rules if r["rule"] == "self.replicas <= self.maxReplicas"]
    values = {"replicas": 9, "maxReplicas": 8, "modelDeployment": "llama-8b", "role": "decode"}
    assert f"`{cel_message(above, values)}`" in DOC
