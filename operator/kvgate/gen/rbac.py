"""What the operator asks of the Kubernetes API, as RBAC rules: the one table.

Every rule names the calls that need it (kvgate's own client, ``kvgate.kube.k8s.KubeApi``, and
kopf's
watches). ``python -m kvgate.gen.rbacgen`` renders this table into the chart's rules
(``charts/kvgate/templates/_rbac-rules.tpl``) and into ``operator/RBAC.md``; a test fails when
either drifts from it. Adding a call to the client means adding its verb here, nowhere else.

Not in this table: the leader-election Lease Role (chart ``rbac.yaml``, limited to one Lease by
name) and the per-ModelDeployment router Role the operator creates (``kvgate.objects.builders``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    # In every watched namespace: a ClusterRole when the operator watches all namespaces, a Role
    # per namespace otherwise.
    NAMESPACED = "namespaced"
    CLUSTER = "cluster"  # always a ClusterRole: cluster-scoped reads
    # A ClusterRole rule only when the operator watches some namespaces (--namespace).
    CLUSTER_WHEN_NAMESPACED = "cluster-when-namespaced"
    # Only without --standalone (kopf peering); the chart always runs --standalone.
    PEERING = "peering"
    # Namespaced, and only with multi-node engines enabled (chart value leaderWorkerSet.enabled):
    # LeaderWorkerSet must be installed for these resources to exist.
    LEADER_WORKER_SET = "leader-worker-set"


@dataclass(frozen=True)
class Rule:
    group: str  # "" is the core group
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str  # the calls that need it (rendered into the chart and RBAC.md)
    scope: Scope = Scope.NAMESPACED


RULES: tuple[Rule, ...] = (
    Rule(
        "kvgate.io",
        ("modeldeployments",),
        ("get", "list", "watch", "patch"),
        "kopf watches them (one reconcile loop each); a reconcile and the engine verifier get "
        "one; patch: a kvgate.io/rollback (JSON patch) and the release of a legacy finalizer",
    ),
    Rule(
        "kvgate.io",
        ("modeldeployments/status",),
        ("patch",),
        "status writes (merge patch of the status subresource)",
    ),
    Rule(
        "kvgate.io",
        ("modeldeployments/finalizers",),
        ("update",),
        "owned objects carry blockOwnerDeletion: clusters running the "
        "OwnerReferencesPermissionEnforcement admission plugin (e.g. OpenShift) require update "
        "on the owner's finalizers for that",
    ),
    Rule(
        "kvgate.io",
        ("rolescales",),
        ("get", "list", "watch", "create", "patch", "delete"),
        "spec.<role>.autoscaling: one RoleScale per autoscaled role (the scale subresource an "
        "HPA or KEDA drives); kopf watches them to act on a new count at once; a pass gets "
        "them, creates a missing one, patches the bounds it copies from the ModelDeployment, "
        "and deletes one whose role is no longer autoscaled",
    ),
    Rule(
        "kvgate.io",
        ("rolescales/status",),
        ("patch",),
        "a RoleScale's status: verified replicas, selector, the count kvgate runs, the pods "
        "being drained",
    ),
    Rule(
        "",
        ("pods",),
        ("get", "list", "watch", "patch", "delete"),
        "engine pods are listed and watched by the operator's own reflector and router and "
        "worker pods by kopf (both by kvgate.io/component); engine pods are listed per "
        "ModelDeployment until the reflector's first list, and by the gateway watch; patch: a "
        "scale-down's drain annotations and pod-deletion-cost on the engine pod it removes; "
        "delete (uid precondition) removes an engine pod a gateway still routes to after its "
        "verification gate turned False; get, list, watch: the `<md>-router` Role grants "
        "them, and RBAC lets the operator grant only what it holds (no escalate)",
    ),
    Rule(
        "",
        ("pods/status",),
        ("patch",),
        "the kvgate.io/engine-verified readiness-gate condition (strategic-merge patch, uid "
        "precondition)",
    ),
    Rule(
        "",
        ("pods/log",),
        ("get",),
        "safety.kvCanary: one followed log stream per verified engine pod (container engine), "
        "read for SGLang's KV canary violations (kvgate.controller.kv_canary_watch); and the "
        "last lines of a failed model download (container kvgate-fetch-model), quoted in the "
        "ModelDeployment's conditions",
    ),
    Rule(
        "apps",
        ("deployments",),
        ("get", "list", "watch", "create", "patch", "delete"),
        "per-revision prefill/decode/router Deployments: created, scaled, annotated, template "
        "drift patched back, superseded ones deleted; listed and watched (the operator's own "
        "store, kvgate.kube.informer) so a change wakes its ModelDeployment and a pass reads them "
        "from memory; get: an engine pod's controller chain",
    ),
    Rule(
        "apps",
        ("replicasets",),
        ("get",),
        "an engine pod is verified only if its controller chain (ReplicaSet -> revision "
        "Deployment -> ModelDeployment) proves it is kvgate's: the pod's ReplicaSet is read",
    ),
    Rule(
        "",
        ("services",),
        ("get", "list", "watch", "create", "patch"),
        "the stable Service `<md>`: switching traffic patches its selector; watched (kopf) so a "
        "deleted or edited Service is put back at once",
    ),
    Rule(
        "",
        ("serviceaccounts",),
        ("get", "list", "watch", "create"),
        "`<md>-router`, ensured on a loop's first pass, after a watch event about it and at the "
        "safety-net resync (kvgate.rollout.access_checks): get checks an existing one is the "
        "ModelDeployment's own (never adopted); watched (kopf, kvgate-labelled) so a deleted one "
        "is put back at once",
    ),
    Rule(
        "rbac.authorization.k8s.io",
        ("roles",),
        ("get", "list", "watch", "create", "patch"),
        "`<md>-router` Role (pods get/list/watch, which the operator holds itself, so no "
        "escalate/bind is needed), ensured as the ServiceAccount: patch restores edited rules; "
        "watched (kopf, kvgate-labelled) so a deleted or edited one is put back at once",
    ),
    Rule(
        "rbac.authorization.k8s.io",
        ("rolebindings",),
        ("get", "list", "watch", "create", "patch", "delete"),
        "`<md>-router` RoleBinding, ensured as the ServiceAccount: patch restores edited "
        "subjects, delete replaces a binding whose (immutable) roleRef changed; watched (kopf, "
        "kvgate-labelled) so a deleted or edited one is put back at once",
    ),
    Rule(
        "",
        ("secrets",),
        ("get", "create", "patch"),
        "`<md>-router-control`, the router's control-plane key (not watched, so read every "
        "pass): get checks it is the "
        "ModelDeployment's own, patch restores the key (derived from the seed, never read "
        "back); get: the engine API key (spec.engine.apiKeySecretRef) for the probe",
    ),
    Rule(
        "networking.k8s.io",
        ("networkpolicies",),
        ("get", "list", "watch", "create", "patch", "delete"),
        "per-revision NetworkPolicies (kvgate.objects.network_policy): created with a revision, "
        "patched "
        "back when they drift, deleted (after a get proves them kvgate's) with a superseded "
        "revision or when turned off; watched (kopf, kvgate-labelled) so a deleted or edited one "
        "is put back at once",
    ),
    Rule(
        "",
        ("events",),
        ("create",),
        "transition Events on pods and ModelDeployments (kvgate's and kopf's, core v1 Events)",
    ),
    Rule(
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("list", "watch"),
        "kopf's resource observer notices the ModelDeployment CRD appearing or changing",
        Scope.CLUSTER,
    ),
    Rule(
        "",
        ("namespaces",),
        ("list", "watch"),
        "kopf's namespace observer matches --namespace against existing namespaces (not when "
        "watching all of them); without it kopf only logs a warning",
        Scope.CLUSTER_WHEN_NAMESPACED,
    ),
    Rule(
        "leaderworkerset.x-k8s.io",
        ("leaderworkersets",),
        ("get", "list", "create", "patch", "delete"),
        "multi-node engines (spec.<role>.nodes > 1, kvgate.objects.lws_builders): one "
        "LeaderWorkerSet "
        "per revision and role, listed every pass, created, scaled, annotated, drift patched "
        "back, superseded ones deleted; get: a leader's controller chain (not watched: its "
        "leader pods' events wake the ModelDeployment)",
        Scope.LEADER_WORKER_SET,
    ),
    Rule(
        "apps",
        ("statefulsets",),
        ("get",),
        "a multi-node engine's leader is verified only if its chain (leader StatefulSet -> "
        "LeaderWorkerSet -> ModelDeployment) proves it is kvgate's, and its workers count only "
        "if their StatefulSet is controlled by that leader (kvgate.verify.lws_identity, "
        "group_gate)",
        Scope.LEADER_WORKER_SET,
    ),
    Rule(
        "kopf.dev",
        ("clusterkopfpeerings", "kopfpeerings"),
        ("get", "list", "watch", "patch"),
        "kopf peering named kvgate (clusterkopfpeerings cluster-wide, kopfpeerings when "
        "namespaced), with kopf's peering CRDs installed; the chart always runs --standalone",
        Scope.PEERING,
    ),
)


def rules(*scopes: Scope) -> list[Rule]:
    """The rules of these scopes, in table order."""
    return [rule for rule in RULES if rule.scope in scopes]


def granted(rule_list: list[Rule]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, as a role with these rules grants them."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rule_list:
        for resource in rule.resources:
            out.setdefault((rule.group, resource), set()).update(rule.verbs)
    return out
