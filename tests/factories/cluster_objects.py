"""A ModelDeployment, its engine pods and its Events as the API server returns them, for the
tests of kvgate explain, history and rollback. The gate messages are written by the operator's
own functions (kvgate.verify.gate, kvgate_engine.verdict), so a change to their wording shows
up here."""

from __future__ import annotations

from typing import Any

from kvgate.api import labels
from kvgate.api.models import ModelDeploymentSpec
from kvgate.api.revision import revision_of
from kvgate.verify import gate
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Requirement, judge

from factories.model_deployments import MD_UID, md_doc

CONTEXT = 131_072
T0 = "2026-11-05T12:00:00Z"


def revision(spec: dict[str, Any]) -> str:
    return revision_of(ModelDeploymentSpec.model_validate(spec))


def spec_of(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = md_doc(**overrides)["spec"]
    return spec


def verdict_condition(
    role: str, pod_name: str, pool: int, context: int = CONTEXT
) -> dict[str, str]:
    """The gate condition the operator writes after reading an engine with this pool."""
    report = EngineReport(
        version="0.5.23",
        role=role,
        kv_pool_tokens=pool,
        kv_pool_tokens_per_rank=(pool,),
        max_req_input_len=min(context - 1, pool - 1) - 5,
        effective_context_length=context,
        served_model_name="llama-3.1-8b",
    )
    requirement = Requirement(context, 1.0, role)
    verdict = judge(report, requirement)
    pod = {"metadata": {"name": pod_name, "labels": {labels.ROLE: role}}}
    return {
        "type": labels.ENGINE_VERIFIED,
        "status": "True" if verdict.reason == "EngineVerified" else "False",
        "reason": verdict.reason,
        "message": gate.verdict_message(pod, verdict, requirement),
        "lastTransitionTime": T0,
    }


def engine_pod(
    md: str, rev: str, role: str, condition: dict[str, str] | None, index: int = 0
) -> dict[str, Any]:
    name = f"{md}-{rev}-{role}-7f9c-{index}"
    conditions = [
        {
            "type": "Ready",
            "status": "True" if condition and condition["status"] == "True" else "False",
        }
    ]
    if condition is not None:
        conditions.append(condition)
    return {
        "metadata": {
            "name": name,
            "namespace": "models",
            "labels": {
                labels.DEPLOYMENT: md,
                labels.ROLE: role,
                labels.REVISION: rev,
                labels.COMPONENT: labels.COMPONENT_ENGINE,
            },
        },
        "status": {"phase": "Running", "conditions": conditions},
    }


def pod_name(md: str, rev: str, role: str, index: int = 0) -> str:
    return f"{md}-{rev}-{role}-7f9c-{index}"


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "observedGeneration": 1,
        "lastTransitionTime": T0,
        "reason": reason,
        "message": message,
    }


def refused_md(
    refusal_message: str, *, spec: dict[str, Any] | None = None, reason: str = "EngineUnsafe"
) -> dict[str, Any]:
    """The first revision of ``llama``, refused; nothing serves."""
    doc = md_doc()
    if spec is not None:
        doc["spec"] = spec
    rev = revision(doc["spec"])
    doc["metadata"]["resourceVersion"] = "41"
    doc["status"] = {
        "observedGeneration": 1,
        "targetRevision": rev,
        "servingRevision": None,
        "refusedRevision": rev,
        "rollout": {
            "verifyStartedAt": T0,
            "refusal": {"reason": reason, "message": refusal_message},
        },
        "conditions": [
            condition(
                "Ready",
                "False",
                "RolloutRefused",
                f"revision {rev} refused: {refusal_message}; nothing serves",
            ),
            condition("EnginesVerified", "False", "KvPoolTooSmall", refusal_message),
            condition("Progressing", "False", "RolloutRefused", f"revision {rev} refused"),
            condition("Degraded", "True", reason, f"revision {rev} refused: {refusal_message}"),
        ],
        "prefill": {"replicas": 1, "readyReplicas": 0, "verifiedReplicas": 0},
        "decode": {"replicas": 1, "readyReplicas": 0, "verifiedReplicas": 0},
    }
    return doc


def serving_md(pool: int = 434_523) -> dict[str, Any]:
    """``llama`` serving its first revision, both roles verified with ``pool`` tokens."""
    doc = md_doc()
    rev = revision(doc["spec"])
    doc["metadata"]["resourceVersion"] = "42"
    doc["status"] = {
        "observedGeneration": 1,
        "targetRevision": rev,
        "servingRevision": rev,
        "conditions": [
            condition("Ready", "True", "RevisionServing", f"revision {rev} serves"),
            condition("EnginesVerified", "True", "AllEnginesVerified"),
            condition("Progressing", "False", "RolloutComplete"),
            condition("Degraded", "False", "AsExpected"),
        ],
        "history": [{"revision": rev, "servedAt": T0, "spec": doc["spec"]}],
        "prefill": {"replicas": 1, "verifiedReplicas": 1, "minVerifiedKvPoolTokens": pool},
        "decode": {"replicas": 1, "verifiedReplicas": 1, "minVerifiedKvPoolTokens": pool},
    }
    return doc


def event(reason: str, message: str, time: str = T0, type_: str = "Warning") -> dict[str, Any]:
    return {
        "type": type_,
        "reason": reason,
        "message": message,
        "count": 1,
        "lastTimestamp": time,
        "involvedObject": {"kind": "ModelDeployment", "name": "llama", "uid": MD_UID},
    }
