"""What kvgate says when it refuses or reports: every reason it writes, and every admission check.

One table, plain data. ``docs/refusals.md`` is generated from it (``python -m
kvgate.gen.refusalsgen``), ``kvgate explain`` prints a reason's "what to change" from it, and a
test fails when the code writes a reason this table does not list (or lists one the code no
longer writes).

A reason appears in one or more places (``where``): a ModelDeployment condition (``Ready``,
``EnginesVerified``, ``Progressing``, ``Degraded``), ``status.rollout.refusal.reason``, an engine
pod's ``kvgate.io/engine-verified`` condition (the gate), an Event, or ``kvgate verify`` and the
guard sidecar's ``/ready`` answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Where a reason appears.
READY = "Ready"
ENGINES_VERIFIED = "EnginesVerified"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
REFUSAL = "status.rollout.refusal"
GATE = "pod gate"
EVENT = "Event"
VERIFY = "kvgate verify, guard"
PLACES = (READY, ENGINES_VERIFIED, PROGRESSING, DEGRADED, REFUSAL, GATE, EVENT, VERIFY)


@dataclass(frozen=True)
class Reason:
    """One CamelCase reason: where it appears, what it means, what to change (empty: nothing,
    it reports a good state or an action kvgate took that needs nothing from you)."""

    name: str
    where: tuple[str, ...]
    means: str
    change: str
    refusal: bool = True  # False: a healthy or in-progress state, not a refusal


@dataclass(frozen=True)
class AdmissionCheck:
    """One admission check (``kvgate.admission.checks``): its function, the fields it denies,
    what a denial means and what to change. The denial's own message carries the numbers."""

    check: str
    fields: str
    means: str
    change: str


_VERDICT = (GATE, ENGINES_VERIFIED, VERIFY)
_UNSAFE = (GATE, ENGINES_VERIFIED, EVENT, VERIFY)

REASONS: tuple[Reason, ...] = (
    # --- the live engine's verdict: the gate on each engine pod, kvgate verify, the guard ----
    Reason(
        "EngineVerified",
        (*_VERDICT,),
        "the live engine proved its KV pool holds contextLength × headroom, and every other "
        "check passed",
        "",
        refusal=False,
    ),
    Reason(
        "KvPoolTooSmall",
        _UNSAFE,
        "the live engine's KV pool (the smallest over its DP ranks) is below contextLength × "
        "headroom: a prompt the deployment advertises would not fit",
        "give the role a bigger pool (a larger tensorParallel, more GPU memory, a higher "
        "memFractionStatic, an fp8 kvCacheDtype) or lower model.contextLength to the pool the "
        "engine reports; `kvgate explain NAME` names the smallest change, `kvgate plan -f` "
        "lists every single change",
    ),
    Reason(
        "ContextTooShort",
        _UNSAFE,
        "the engine's effective context length is below contextLength: it refuses prompts the "
        "deployment advertises",
        "lower model.contextLength to the model's own limit, or check that the model config "
        "and the image are the ones you meant",
    ),
    Reason(
        "ContextTooLong",
        _UNSAFE,
        "the engine accepts prompts longer than contextLength, which no engine of its revision "
        "was proven to hold",
        "use an image whose entrypoint adds no --context-length (kvgate passes its own; "
        "engine.args may not set it)",
    ),
    Reason(
        "MaxInputTooShort",
        _UNSAFE,
        "the engine's max_req_input_len is below contextLength − 6: its pool or its window "
        "cuts prompts short",
        "as for KvPoolTooSmall: a bigger pool or a smaller model.contextLength",
    ),
    Reason(
        "MaxInputTooLong",
        _UNSAFE,
        "the engine's max_req_input_len reaches contextLength: it would take a prompt that "
        "leaves no room to generate a token",
        "run the engine with the --context-length kvgate passes (an image entrypoint that "
        "adds flags is the usual cause)",
    ),
    Reason(
        "RoleMismatch",
        _UNSAFE,
        "the engine runs a different disaggregation mode (prefill/decode) than its pod's role",
        "use an image whose entrypoint does not set --disaggregation-mode",
    ),
    Reason(
        "EngineVersionTooOld",
        _UNSAFE,
        "the engine reports an SGLang version below safety.minEngineVersion",
        "use an engine image at or above the floor (e.g. lmsysorg/sglang:v0.5.23)",
    ),
    Reason(
        "EngineVersionUnknown",
        _VERDICT,
        "the engine reports a source-build version (0.0.0.devN): whether it is above the floor "
        "cannot be told",
        "run a released image, or build SGLang from a release tag",
    ),
    Reason(
        "EngineUnreachable",
        _VERDICT,
        "the engine's /server_info did not answer (not listening yet, crashed, a "
        "NetworkPolicy in the way): could not tell, never safe",
        "wait for the engine to load; else read its log (`kubectl logs POD -c engine`); the "
        "rollout is refused after rollout.verifyTimeoutSeconds",
    ),
    Reason(
        "EngineUnauthorized",
        _VERDICT,
        "the engine answered 401/403: it was started with an API key kvgate does not send",
        "set spec.engine.apiKeySecretRef to the Secret holding the key (never --api-key in "
        "engine.args); for kvgate verify, pass --api-key or KVGATE_ENGINE_API_KEY",
    ),
    Reason(
        "ReportUnreadable",
        _VERDICT,
        "the engine answered, but not with the numbers kvgate needs (a field missing, a body "
        "over the cap, a redirect, not JSON): could not tell",
        "check that the image is SGLang at or above the floor; the message names the field "
        "or the limit",
    ),
    Reason(
        "EngineNotReady",
        (GATE, ENGINES_VERIFIED),
        "a verified engine's container stopped being ready (restart, crash): the gate turned "
        "False at once",
        "nothing when it comes back (it is verified again); else read the engine's log",
    ),
    Reason(
        "NotOwnedByModelDeployment",
        (GATE, ENGINES_VERIFIED),
        "the pod's controller chain (pod → ReplicaSet → revision Deployment → ModelDeployment) "
        "does not hold: labels alone prove nothing",
        "nothing for kvgate's own pods; a pod someone made with kvgate's labels never takes "
        "traffic: delete it",
    ),
    Reason(
        "RequirementUnknown",
        (GATE, ENGINES_VERIFIED),
        "the pod's revision is neither the spec's nor recorded in status.revisions, or the "
        "spec is invalid: what it must prove is unknown",
        "fix the spec (see InvalidSpec); an old revision's pods go when its rollout ends",
    ),
    Reason(
        "KvCanaryViolation",
        (GATE, ENGINES_VERIFIED, EVENT),
        "SGLang's KV canary found a corrupt KV slot in the engine's log; sticky for the pod's life",
        "delete the pod to replace it; if it repeats, suspect the engine build or the GPU",
    ),
    Reason(
        "EngineGroupIncomplete",
        (GATE, ENGINES_VERIFIED),
        "a multi-node engine group misses a rank: the leader is not verified until every rank runs",
        "wait for the group's pods; check node capacity for spec.<role>.nodes pods",
    ),
    Reason(
        "EngineGroupChanged",
        (GATE, ENGINES_VERIFIED),
        "a multi-node group's workers changed since it was verified; it is verified again",
        "",
        refusal=False,
    ),
    # --- the ModelDeployment's conditions and its rollout -------------------------------------
    Reason(
        "RevisionServing",
        (READY, EVENT),
        "the spec's revision serves with enough verified prefill and decode pods",
        "",
        refusal=False,
    ),
    Reason(
        "RolloutInProgress",
        (READY, PROGRESSING),
        "a new revision is being verified (or is in a progressive step) while the old one serves",
        "wait; it is refused after rollout.verifyTimeoutSeconds if its engines never verify",
        refusal=False,
    ),
    Reason(
        "AwaitingVerification",
        (READY,),
        "the first revision is being verified; nothing serves yet",
        "wait; `kvgate explain NAME` shows each pod's gate",
        refusal=False,
    ),
    Reason(
        "NotEnoughVerifiedEngines",
        (READY,),
        "the serving revision has fewer verified pods than it needs (replicas), or its router "
        "is not ready",
        "look at the pods' gates (`kvgate explain NAME`); a pod that lost verification says why",
    ),
    Reason(
        "RolloutRefused",
        (READY, PROGRESSING, EVENT),
        "the spec's revision was refused (status.rollout.refusal says why, with the numbers); "
        "the previous revision keeps serving, untouched",
        "change the spec as the refusal says and apply again (a refused revision is retried "
        "only after a spec change, or once its three Deployments are deleted); or roll back",
    ),
    Reason(
        "RolloutComplete",
        (PROGRESSING,),
        "the spec's revision serves; nothing is in flight",
        "",
        refusal=False,
    ),
    Reason(
        "ProgressiveStep",
        (PROGRESSING,),
        "a progressive rollout moves a share of the traffic to the new revision",
        "",
        refusal=False,
    ),
    Reason(
        "AllEnginesVerified",
        (ENGINES_VERIFIED,),
        "every engine pod of the spec's revision passed verification",
        "",
        refusal=False,
    ),
    Reason(
        "VerificationPending",
        (ENGINES_VERIFIED,),
        "some engine pods of the spec's revision are not verified yet (none failed)",
        "wait; pods still starting or loading weights",
        refusal=False,
    ),
    Reason(
        "NotVerified",
        (ENGINES_VERIFIED,),
        "an engine pod is not verified and its gate carries no reason yet",
        "wait for the first probe; `kvgate explain NAME` shows each pod",
    ),
    Reason(
        "AsExpected",
        (DEGRADED,),
        "nothing is degraded",
        "",
        refusal=False,
    ),
    Reason(
        "EngineUnsafe",
        (DEGRADED, REFUSAL),
        "a pod of the new revision got an unsafe verdict (its gate reason and numbers are in "
        "the message)",
        "the fix of the pod's reason (e.g. KvPoolTooSmall), then apply the changed spec",
    ),
    Reason(
        "VerificationTimeout",
        (DEGRADED, REFUSAL),
        "the new revision was not verified within rollout.verifyTimeoutSeconds",
        "fix what keeps its engines from verifying (pods Pending, engines not loading, "
        "unreachable), or raise rollout.verifyTimeoutSeconds; then change the spec",
    ),
    Reason(
        "StepCheckFailed",
        (DEGRADED, REFUSAL),
        "a progressive step's 5xx (or 4xx) share on the new revision exceeded "
        "rollout.stepCheck; all traffic went back to the old revision",
        "find why the new revision fails requests (its routers' and engines' logs), or loosen "
        "rollout.stepCheck; then change the spec",
    ),
    Reason(
        "ContentCheckFailed",
        (DEGRADED, REFUSAL, EVENT),
        "the content check at maximum length got a wrong answer through the new revision's "
        "router (an over-length prompt answered, an in-range one refused, or, after a request "
        "dropped mid-flight, a known-answer request answered with other tokens: abort-path "
        "contamination)",
        "do not serve this engine build or flag set (e.g. --allow-auto-truncate, or a build "
        "whose aborted requests leave KV behind); the message lists each length and answer, "
        "and the output ids wanted and got",
    ),
    Reason(
        "ContentCheckPassed",
        (EVENT,),
        "the new revision answered the content check as a safe engine does",
        "",
        refusal=False,
    ),
    Reason(
        "EngineVerificationLost",
        (DEGRADED, EVENT),
        "a serving pod lost its verification (engine shrank, restarted, unreachable): it takes "
        "no traffic",
        "the message has the pod's new reason; fix that, or delete the pod to replace it",
    ),
    Reason(
        "InvalidSpec",
        (READY, EVENT),
        "the stored spec does not parse for this kvgate version, or mounts a host path the "
        "cluster does not allow (chart values hostPaths.*), admitted before a rule existed or "
        "with the webhook bypassed: kvgate builds nothing from it",
        "fix the fields the message names (`kvgate validate` gives the same answer) and apply, "
        "or ask the cluster admin to allow the host path",
    ),
    Reason(
        "Conflict",
        (READY, DEGRADED, EVENT),
        "an object kvgate must manage (the Service <md>, a revision Deployment, the router's "
        "ServiceAccount/Role/RoleBinding/Secret, a NetworkPolicy) exists but is not the "
        "ModelDeployment's own; kvgate never adopts it",
        "delete or rename the object the message names",
    ),
    Reason(
        "LeaderWorkerSetUnavailable",
        (DEGRADED, EVENT),
        "spec.<role>.nodes > 1 needs LeaderWorkerSet, which the cluster lacks or kvgate may "
        "not manage",
        "install LeaderWorkerSet and set the chart value leaderWorkerSet.enabled=true, or set "
        "spec.<role>.nodes to 1",
    ),
    # --- Events about what kvgate did -------------------------------------------------------
    Reason(
        "RolloutStarted",
        (EVENT,),
        "a spec change created a new revision; it serves once its engines are verified",
        "",
        refusal=False,
    ),
    Reason(
        "TrafficStepStarted",
        (EVENT,),
        "a progressive step began",
        "",
        refusal=False,
    ),
    Reason(
        "ServiceRecreated",
        (EVENT,),
        "the Service <md> was missing and kvgate recreated it (a new ClusterIP)",
        "find who deleted it; clients holding the old IP must resolve the name again",
        refusal=False,
    ),
    Reason(
        "ServiceSelectorRestored",
        (EVENT,),
        "the Service <md> selected another revision; kvgate put its selector back",
        "find who edited it",
        refusal=False,
    ),
    Reason(
        "ServingDeploymentRecreated",
        (EVENT,),
        "a Deployment of the serving revision was missing; kvgate recreated it",
        "find who deleted it",
        refusal=False,
    ),
    Reason(
        "ModelDownloadFailing",
        (ENGINES_VERIFIED, EVENT),
        "an engine pod's model download (init container kvgate-fetch-model) failed and is "
        "retried with the kubelet's back-off; the engine starts once it succeeds (the message "
        "quotes the download's last log line)",
        "fix what that line names (spec.model.source.download: repo, revision, the token's "
        "Secret, the volume's size), or the hub; a revision that never downloads is refused at "
        "rollout.verifyTimeoutSeconds",
        refusal=False,
    ),
    Reason(
        "FailedCreate",
        (ENGINES_VERIFIED, DEGRADED, EVENT),
        "the API server refuses the pods of one of the revision's Deployments (a ResourceQuota, "
        "a LimitRange, Pod Security or an admission webhook or policy of the namespace): the "
        "ReplicaSet controller's ReplicaFailure condition, reason FailedCreate, whose message "
        "kvgate quotes; the Ready and Progressing messages say it too. A target revision whose "
        "pods never exist is refused at rollout.verifyTimeoutSeconds",
        "fix what the quoted message names (raise or lift the quota, label the namespace for "
        "the Pod Security level the pods need, or change the policy that refuses them); the "
        "ReplicaSet controller retries on its own, with back-off",
    ),
    Reason(
        "KvPoolEstimateOptimistic",
        (EVENT,),
        "a role's verified engine holds a live KV pool more than estimator.optimisticDriftPercent "
        "below the admission estimate for its shape: admission may allow shapes that come up "
        "short",
        "check spec.<role>.gpuMemoryGiB, then set the reserve status.<role>.poolEstimate names "
        "for the GPU product (chart value estimator.gpuReservedGiBByProduct) or the role's "
        "gpuReservedGiB",
        refusal=False,
    ),
    Reason(
        "ScalingDown",
        (GATE, EVENT),
        "a scale-down of an autoscaled role took this engine out of traffic (gate False, so "
        "smg drops it); it is removed once it has no request or KV transfer in flight",
        "",
        refusal=False,
    ),
    Reason(
        "EngineDrained",
        (EVENT,),
        "a scale-down's engine finished its requests and KV transfers; kvgate removes exactly it",
        "",
        refusal=False,
    ),
    Reason(
        "DrainTimedOut",
        (EVENT,),
        "a scale-down's engine still had requests or KV transfers in flight after "
        "spec.<role>.autoscaling.drainTimeoutSeconds; kvgate removed it anyway",
        "raise drainTimeoutSeconds above your longest request, or find what holds the engine",
    ),
    Reason(
        "ScaleDownCancelled",
        (EVENT,),
        "the role's count rose again before a drained engine was removed; it is verified again "
        "before it takes traffic",
        "",
        refusal=False,
    ),
    Reason(
        "GatewayIgnoredNotReady",
        (EVENT,),
        "a gateway kept routing to an engine pod after its gate turned False, past the grace "
        "period: kvgate deleted the pod",
        "check the router's version and its discovery (smg drops NotReady pods)",
    ),
    Reason(
        "UnknownWorkerRemoved",
        (EVENT,),
        "a router listed a worker that is not a verified engine pod of its revision; kvgate "
        "removed it",
        "find who holds the router's control-plane key (the Secret the message names)",
    ),
    Reason(
        "RouterKeyRefused",
        (EVENT,),
        "a router refused kvgate's control-plane key (it started on a Secret kvgate did not "
        "write); kvgate deleted the router pod",
        "find who wrote the router's key Secret; kvgate restores it",
    ),
    Reason(
        "RollbackStarted",
        (EVENT,),
        "a kvgate.io/rollback annotation restored a recorded spec; an ordinary, verified "
        "rollout to it follows",
        "",
        refusal=False,
    ),
    Reason(
        "RollbackRefused",
        (EVENT,),
        "the kvgate.io/rollback annotation named no revision kept in status.history (or an "
        "ambiguous prefix, or a spec the webhook now denies); nothing changed",
        "ask for one of the revisions the message lists (`kvgate history NAME`), or apply the "
        "spec you want",
    ),
    Reason(
        "RollbackNotNeeded",
        (EVENT,),
        "the kvgate.io/rollback annotation named the spec's own revision; nothing changed",
        "",
        refusal=False,
    ),
)

# Each admission check, in the order the webhook runs them. A denial names its field and carries
# the numbers; ``kvgate validate FILE`` gives the same answers offline.
ADMISSION_CHECKS: tuple[AdmissionCheck, ...] = (
    AdmissionCheck(
        "check_identity",
        "apiVersion, kind",
        "not a kvgate.io/v1alpha1 ModelDeployment",
        "set apiVersion: kvgate.io/v1alpha1 and kind: ModelDeployment",
    ),
    AdmissionCheck(
        "check_metadata",
        "metadata.name",
        "not a DNS-1035 label, or too long for the names kvgate derives from it (the Service "
        "<name>, <name>-<rev>-prefill, ...)",
        "rename it: lowercase letters, digits and '-', starting with a letter, at most the "
        "length the message gives (e.g. llama-3-1-8b for llama-3.1-8b)",
    ),
    AdmissionCheck(
        "check_size",
        "spec",
        "the spec is over 96 KiB as compact JSON (it must fit twice in an object's annotations)",
        "shrink model.config to the model's own config.json",
    ),
    AdmissionCheck(
        "parse_model",
        "any spec field",
        "the CRD's schema and CEL rules: a missing field, a wrong type, a value out of its "
        "range (replicas, tensorParallel, timeouts, list lengths)",
        "set the field as the message says (`kubectl explain modeldeployment.spec.FIELD`)",
    ),
    AdmissionCheck(
        "check_group_names",
        "metadata.name",
        "too long for the StatefulSet names LeaderWorkerSet derives for a multi-node role",
        "use a shorter name",
    ),
    AdmissionCheck(
        "check_finite",
        "spec.<role>.gpuMemoryGiB, gpuReservedGiB, spec.model.weightsGiB, safety.headroom",
        "a number that is not finite, or a size no GPU has (gpuMemoryGiB above 16,384, a "
        "reserve that takes the whole GPU)",
        "write the size of one GPU in GiB (80 for an H100) and a reserve below it",
    ),
    AdmissionCheck(
        "check_shape",
        "spec.<role>.tensorParallel, spec.<role>.nodes",
        "tensorParallel does not split evenly over the role's nodes, or needs more GPUs per "
        "node than a node has (chart value gpusPerNode)",
        "a tensorParallel that is a multiple of nodes, at most gpusPerNode per node",
    ),
    AdmissionCheck(
        "check_tensor_parallel_heads",
        "spec.<role>.tensorParallel",
        "the model's attention heads do not split over that many ranks (SGLang asserts at "
        "start-up)",
        "one of the sizes the message lists",
    ),
    AdmissionCheck(
        "check_engine_version",
        "spec.safety.minEngineVersion, spec.engine.image",
        "a version floor or an image tag below the cluster's floor (chart value "
        "engineVersionFloor), or not a version",
        "an image at or above the floor, and minEngineVersion at or above it",
    ),
    AdmissionCheck(
        "check_engine_flag_values",
        "spec.engine.kvCacheDtype, spec.engine.transfer.backend",
        "a value the image's SGLang release does not accept (the engine would exit 2 and "
        "crash-loop)",
        "one of the values the message lists for that release",
    ),
    AdmissionCheck(
        "check_max_total_tokens",
        "spec.<role>.maxTotalTokens",
        "a pool cap below contextLength × headroom",
        "raise it to at least the number given, or remove it",
    ),
    AdmissionCheck(
        "check_context_length",
        "spec.model.contextLength",
        "above the context the model's config supports (SGLang refuses to start)",
        "lower it to the model's limit, or set engine env "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
    ),
    AdmissionCheck(
        "check_estimated_pool",
        "spec.<role>",
        "the estimated KV pool of the role's GPU shape is below contextLength × headroom, or "
        "the weights leave no room for a KV cache (needs model.config and gpuMemoryGiB)",
        "the smallest change the message names (the planner's), or lower contextLength; "
        "`kvgate plan -f FILE` lists every single change",
    ),
    AdmissionCheck(
        "check_router_args",
        "spec.router.args[i]",
        "a gateway flag that adds workers, changes discovery, auth, the listener or TLS",
        "remove it; kvgate sets those itself",
    ),
    AdmissionCheck(
        "check_engine",
        "spec.engine.args[i], spec.engine.transfer",
        "an SGLang flag kvgate sets itself (under any spelling SGLang reads as it), one kvgate "
        "cannot size or verify (data parallelism, role switching), --config, or a transfer "
        "section that cannot work",
        "remove the flag and set the spec field the message names",
    ),
    AdmissionCheck(
        "check_model_source",
        "spec.model.path, spec.model.source.download.storage.emptyDir.sizeLimit",
        "with spec.model.source, a model.path outside /models (where the source is mounted), or "
        "a download emptyDir smaller than the weights (the pod would be evicted mid-download)",
        "set model.path under /models; raise the emptyDir sizeLimit to the size the message "
        "gives, or download to a persistentVolumeClaim",
    ),
    AdmissionCheck(
        "check_host_paths_allowed",
        "spec.model.source.hostPath.path, spec.engine.transfer.rdma.hostPath, "
        "spec.<role>.extraVolumes[i].hostPath",
        "a node directory the cluster admin does not allow: a model hostPath outside the chart "
        "value hostPaths.modelPrefixes (empty by default: no hostPath source), one with '.' or "
        "'..' segments, an RDMA hostPath other than those in hostPaths.rdmaDevices (by "
        "default /dev/infiniband), or a hostPath among a role's extraVolumes",
        "use a persistentVolumeClaim, an image or a download for the weights, or ask the "
        "cluster admin to list the nodes' weights directory in hostPaths.modelPrefixes; set "
        "transfer.rdma.hostPath to /dev/infiniband, or use transfer.rdma.resourceName; give "
        "extra files as a configMap, secret or persistentVolumeClaim volume",
    ),
    AdmissionCheck(
        "check_autoscaling",
        "spec.<role>.autoscaling, spec.<role>.replicas, spec.prefillPerDecode",
        "minReplicas above maxReplicas, replicas outside them, autoscaling on a multi-node "
        "role, or prefillPerDecode bounds no pair of counts within the roles' bounds satisfies "
        "(or set without both roles autoscaled)",
        "bounds a count can meet: the message gives the numbers",
    ),
    AdmissionCheck(
        "check_pod_fit",
        "spec.<role>.podLabels, podAnnotations, resources, extraVolumes, extraVolumeMounts, "
        "extraEnv, spec.engine.transfer.rdma.resourceName, spec.router.resources",
        "pod customization that touches what the gate depends on: a kvgate.io, sglang.ai or "
        "leaderworkerset.sigs.k8s.io key (or another key kvgate or the controllers set), a "
        "count of the role's acceleratorResource other than tensorParallel / nodes or a "
        "second accelerator, kvgate's volume names or mount paths, KVGATE_ENGINE_API_KEY; or "
        "what Kubernetes refuses in a pod (a malformed label key or value)",
        "use another key; remove the accelerator from resources (kvgate sets it) or set "
        "acceleratorResource; name and mount extra volumes elsewhere; the message names the "
        "field",
    ),
)

BY_NAME: dict[str, Reason] = {reason.name: reason for reason in REASONS}


def reason(name: str) -> Reason | None:
    """The catalogue's row for a reason, or None for one it does not list."""
    return BY_NAME.get(name)


def names(rows: Iterable[Reason] = REASONS) -> frozenset[str]:
    return frozenset(row.name for row in rows)


__all__ = [
    "ADMISSION_CHECKS",
    "BY_NAME",
    "PLACES",
    "REASONS",
    "AdmissionCheck",
    "Reason",
    "names",
    "reason",
]
