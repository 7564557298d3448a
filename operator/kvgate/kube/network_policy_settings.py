"""The operator's NetworkPolicy settings, read from the environment the chart sets.

``KVGATE_NETWORK_POLICIES``        true (default) | false: build per-revision NetworkPolicies
``KVGATE_OPERATOR_NAMESPACE``      the operator's namespace (chart: downward API), else
                                   ``POD_NAMESPACE``
``KVGATE_OPERATOR_POD_LABELS``     JSON object: labels that select the operator's pods
``KVGATE_ROUTER_EGRESS_POLICY``    true | false (default): also restrict the routers' egress
``KVGATE_ROUTER_EGRESS_ALLOW``     JSON list of NetworkPolicyEgressRule besides the revision's
                                   engines (default: TCP 443 and 6443 anywhere, the API server)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgate.objects.network_policy import DEFAULT_API_SERVER_EGRESS, RouterEgress

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class NetworkPolicySettings:
    """What ``network_policy.network_policies`` needs besides the ModelDeployment."""

    operator_namespace: str
    operator_pod_labels: dict[str, str] = field(default_factory=dict)
    router_egress: RouterEgress | None = None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise SystemExit(f"{name}={env[name]!r} is not a boolean; use true or false")


def _json(env: Mapping[str, str], name: str, example: str) -> Any:
    try:
        return json.loads(env[name])
    except ValueError as exc:
        raise SystemExit(f"{name} is not valid JSON ({exc}); expected e.g. {example}") from exc


def network_policy_settings(env: Mapping[str, str]) -> NetworkPolicySettings | None:
    """None when ``KVGATE_NETWORK_POLICIES=false``; exits naming the variable when the
    operator's identity, which every engine policy must admit, is missing or malformed."""
    if not _flag(env, "KVGATE_NETWORK_POLICIES", True):
        return None
    namespace = env.get("KVGATE_OPERATOR_NAMESPACE") or env.get("POD_NAMESPACE") or ""
    labels_example = '{"app.kubernetes.io/name": "kvgate"}'
    pod_labels = (
        _json(env, "KVGATE_OPERATOR_POD_LABELS", labels_example)
        if (env.get("KVGATE_OPERATOR_POD_LABELS"))
        else {}
    )
    if not namespace or not pod_labels:
        raise SystemExit(
            "KVGATE_NETWORK_POLICIES is on, so every engine's NetworkPolicy must admit the "
            "operator's probes, but the operator's "
            + ("namespace" if not namespace else "pod labels")
            + " is unknown: set KVGATE_OPERATOR_NAMESPACE and KVGATE_OPERATOR_POD_LABELS (the "
            "chart does), or KVGATE_NETWORK_POLICIES=false when the operator runs outside the "
            "cluster (its probes would not come from a pod a policy can name)"
        )
    if not isinstance(pod_labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in pod_labels.items()
    ):
        raise SystemExit(
            f"KVGATE_OPERATOR_POD_LABELS must be a JSON object of strings, e.g. {labels_example}"
        )
    router_egress = None
    if _flag(env, "KVGATE_ROUTER_EGRESS_POLICY", False):
        allow: Any = DEFAULT_API_SERVER_EGRESS
        if env.get("KVGATE_ROUTER_EGRESS_ALLOW"):
            allow = _json(env, "KVGATE_ROUTER_EGRESS_ALLOW", '[{"ports": [{"port": 6443}]}]')
            if not isinstance(allow, list) or not all(isinstance(r, dict) for r in allow):
                raise SystemExit(
                    "KVGATE_ROUTER_EGRESS_ALLOW must be a JSON list of NetworkPolicy egress "
                    'rules, e.g. [{"ports": [{"port": 6443, "protocol": "TCP"}]}]'
                )
        router_egress = RouterEgress(allow=tuple(allow))
    return NetworkPolicySettings(namespace, dict(pod_labels), router_egress)
