"""Operator run-time settings: CLI flags plus a few environment overrides (one place to read)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from kvgate.admission.gpu_reserve import RESERVES_ENV, parse_reserves
from kvgate.admission.host_paths import (
    MODEL_PREFIXES_ENV,
    RDMA_DEVICES_ENV,
    HostPathPolicy,
    host_path_policy,
)
from kvgate.admission.policy import GPUS_PER_NODE_ENV, parse_gpus_per_node
from kvgate.kube.leader import LeaderConfig
from kvgate.kube.network_policy_settings import NetworkPolicySettings, network_policy_settings
from kvgate.rollout.pool_drift import DEFAULT_OPTIMISTIC_DRIFT_PERCENT

# Every KVGATE_* variable: unset or empty means the default; any other value is parsed as written
# (an explicit 0 is a value, never "unset") and one outside its range stops the operator with a
# message naming the variable, the value and the range.

# The shortest period or timeout accepted: a reconcile, re-verification or audit every 0 s is a
# busy loop, and a 0 s probe timeout fails every probe. A grace period of 0 s is legitimate.
MIN_PERIOD_SECONDS = 0.1
LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


OPTIMISTIC_DRIFT_ENV = "KVGATE_OPTIMISTIC_DRIFT_PERCENT"


def env(name: str) -> str | None:
    """The variable's value; None when unset or empty."""
    raw = os.environ.get(name)
    return raw if raw else None


def _env_float(
    name: str, valid: Callable[[float], bool], must: str, about: str = ""
) -> float | None:
    """The variable as a finite number (None when unset); anything else, or a number ``valid``
    refuses, stops start-up with ``{name}={raw!r}{about}: {must}``."""
    raw = env(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and valid(value)):
        raise SystemExit(f"{name}={raw!r}{about}: {must}")
    return value


def _env_seconds_or_none(name: str, minimum: float, unset: str) -> float | None:
    return _env_float(
        name,
        lambda v: v >= minimum,
        f"must be a number of seconds >= {minimum:g}; unset it for {unset}",
    )


def _env_seconds(name: str, default: float, minimum: float = MIN_PERIOD_SECONDS) -> float:
    value = _env_seconds_or_none(name, minimum, f"the default, {default:g} s")
    return default if value is None else value


def _gpus_per_node() -> int | None:
    try:
        return parse_gpus_per_node(env(GPUS_PER_NODE_ENV))
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _gpu_reserves() -> dict[str, float]:
    try:
        return parse_reserves(env(RESERVES_ENV))
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _host_paths() -> HostPathPolicy:
    try:
        return host_path_policy(env(MODEL_PREFIXES_ENV), env(RDMA_DEVICES_ENV))
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _optimistic_drift_percent() -> float:
    value = _env_float(
        OPTIMISTIC_DRIFT_ENV,
        lambda v: 0 < v < 100,
        "must be a percentage between 0 and 100, e.g. 10; unset it for the default, "
        f"{DEFAULT_OPTIMISTIC_DRIFT_PERCENT:g}",
        about=" (the chart value estimator.optimisticDriftPercent)",
    )
    return DEFAULT_OPTIMISTIC_DRIFT_PERCENT if value is None else value


def _env_rate(name: str, default: float) -> float:
    value = _env_float(
        name,
        lambda v: v > 0,
        f"must be a number of reads per second > 0; unset it for the default, {default:g}",
    )
    return default if value is None else value


def _env_count(name: str, default: int) -> int:
    raw = env(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(
            f"{name}={raw!r}: must be a whole number >= 1; unset it for the default, {default}"
        )
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str, *, upper: bool = False) -> str:
    """The variable's value among ``choices`` (``default`` when unset); any other value stops
    the process naming the variable and the choices."""
    raw = env(name)
    if raw is None:
        return default
    value = raw.upper() if upper else raw
    if value not in choices:
        raise SystemExit(
            f"{name}={raw!r}: must be one of {', '.join(choices)}; unset it for the default, "
            f"{default}"
        )
    return value


def bind_address() -> str:
    """KVGATE_BIND_ADDRESS (default 0.0.0.0); not an IP address or host name stops the process."""
    raw = env("KVGATE_BIND_ADDRESS")
    if raw is None:
        return "0.0.0.0"
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not _HOSTNAME.fullmatch(raw):
            raise SystemExit(
                f"KVGATE_BIND_ADDRESS={raw!r}: must be an IP address or a host name; unset it "
                "for the default, 0.0.0.0 (every interface)"
            ) from None
    return raw


def _guard_image() -> str | None:
    raw = env("KVGATE_GUARD_IMAGE")
    if raw is not None and any(c.isspace() for c in raw):
        raise SystemExit(
            f"KVGATE_GUARD_IMAGE={raw!r}: must be an image reference without spaces, e.g. "
            "ghcr.io/kvgate/kvgate-operator:0.1.0; unset it for engine pods without a guard"
        )
    return raw


_GUARD_RESOURCES_EXAMPLE = (
    '{"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}'
)


def _guard_resources() -> dict[str, dict[str, str]] | None:
    """KVGATE_GUARD_RESOURCES: the guard sidecar's ResourceRequirements as JSON (the chart value
    guard.resources); None when unset (kvgate.objects.builders.GUARD_RESOURCES). Checked here, not
    by the first engine Deployment the API server would refuse."""
    raw = env("KVGATE_GUARD_RESOURCES")
    if raw is None:
        return None
    problem = (
        f"KVGATE_GUARD_RESOURCES={raw!r}: must be a JSON object with requests and/or limits, "
        f"each naming resources and quantities, e.g. {_GUARD_RESOURCES_EXAMPLE}; unset it for "
        "the default"
    )
    try:
        value = json.loads(raw)
    except ValueError:
        raise SystemExit(problem) from None
    if not isinstance(value, dict) or not set(value) <= {"requests", "limits"}:
        raise SystemExit(problem)
    resources: dict[str, dict[str, str]] = {}
    for part, quantities in value.items():
        if not isinstance(quantities, dict) or not all(
            isinstance(name, str)
            and name
            and isinstance(quantity, str | int | float)
            and not isinstance(quantity, bool)
            and str(quantity)
            for name, quantity in quantities.items()
        ):
            raise SystemExit(problem)
        resources[part] = {name: str(quantity) for name, quantity in quantities.items()}
    return resources


PULL_SECRETS_ENV = "KVGATE_ENGINE_IMAGE_PULL_SECRETS"
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def parse_pull_secrets(raw: str | None) -> tuple[str, ...]:
    """KVGATE_ENGINE_IMAGE_PULL_SECRETS: the chart's imagePullSecrets as JSON, a list of
    {"name": ...} (as the chart value is written) or of names; () when unset. Raises ValueError
    naming the variable, the value and the form."""
    if raw is None:
        return ()
    problem = (
        f"{PULL_SECRETS_ENV}={raw!r} (the chart value imagePullSecrets): must be a JSON list of "
        'Secret names or {"name": ...} objects, e.g. [{"name": "regcred"}]; unset it for none'
    )
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(problem) from None
    if not isinstance(value, list):
        raise ValueError(problem)
    names: list[str] = []
    for entry in value:
        name = entry.get("name") if isinstance(entry, dict) and set(entry) == {"name"} else entry
        if not isinstance(name, str) or len(name) > 253 or not _SECRET_NAME.fullmatch(name):
            raise ValueError(problem)
        names.append(name)
    return tuple(dict.fromkeys(names))


def _pull_secrets() -> tuple[str, ...]:
    try:
        return parse_pull_secrets(env(PULL_SECRETS_ENV))
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _router_key_seed() -> bytes:
    raw = env("KVGATE_ROUTER_KEY_SEED")
    if raw is None:
        return secrets.token_bytes(32)
    if len(raw) < 16:
        raise SystemExit(
            f"KVGATE_ROUTER_KEY_SEED has {len(raw)} characters; use at least 16 random ones "
            "(the chart generates 48)"
        )
    return raw.encode()


def leader_config(enabled: bool) -> LeaderConfig | None:
    """`--leader-elect`: the Lease this replica competes for (KVGATE_LEADER_* and POD_*)."""
    if not enabled:
        return None
    namespace = env("KVGATE_LEADER_ELECTION_NAMESPACE") or env("POD_NAMESPACE")
    if namespace is None:
        raise SystemExit(
            "--leader-elect needs the namespace of its Lease: set KVGATE_LEADER_ELECTION_NAMESPACE "
            "or POD_NAMESPACE (the chart sets POD_NAMESPACE from the pod's own namespace)"
        )
    identity = env("POD_NAME") or f"{socket.gethostname()}_{secrets.token_hex(4)}"
    config = LeaderConfig(
        namespace=namespace,
        name=env("KVGATE_LEADER_ELECTION_LEASE") or "kvgate-operator",
        identity=identity,
        lease_duration_seconds=_env_seconds("KVGATE_LEADER_LEASE_DURATION_SECONDS", 10.0),
        renew_deadline_seconds=_env_seconds("KVGATE_LEADER_RENEW_DEADLINE_SECONDS", 7.0),
        retry_period_seconds=_env_seconds("KVGATE_LEADER_RETRY_PERIOD_SECONDS", 2.0),
    )
    problems = config.problems()
    if problems:
        raise SystemExit("leader election: " + "; ".join(problems))
    return config


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()  # empty: cluster-wide
    standalone: bool = False
    metrics_port: int = 8080
    health_port: int = 8081
    webhook_port: int = 9443
    tls_dir: str | None = None
    webhook: bool = True
    bind_address: str = "0.0.0.0"  # KVGATE_BIND_ADDRESS; tests use 127.0.0.1
    reconcile_seconds: float = 5.0  # KVGATE_RECONCILE_SECONDS: while a rollout is in flight
    # KVGATE_STEADY_RECONCILE_SECONDS: the safety-net resync of a settled ModelDeployment.
    # Every change to what kvgate watches (the ModelDeployment, its Deployments, engine and
    # router pods, Service, router RBAC, NetworkPolicies) wakes its loop at once; the resync
    # only catches drift in what no watch reports (the router's key Secret, LeaderWorkerSets),
    # so it is as long as controller-runtime's default SyncPeriod, 10 h: API traffic at rest
    # is then ~10 reads per ModelDeployment per 10 h, not per minute (README, Measured: Scale).
    steady_reconcile_seconds: float = 36_000.0
    reverify_seconds: float | None = None  # KVGATE_REVERIFY_SECONDS overrides the CR's interval
    probe_timeout_seconds: float = 5.0  # KVGATE_PROBE_TIMEOUT_SECONDS
    # KVGATE_MAX_CONCURRENT_PROBES: engine probes in flight at once, across every pod. A probe
    # holds at most 5 MiB of body (4 MiB /server_info + 1 MiB /v1/models), so 16 hold <= 80 MiB.
    max_concurrent_probes: int = 16
    # KVGATE_MAX_CONCURRENT_RECONCILES: ModelDeployment passes in flight at once. A pass holds
    # its ModelDeployment's Deployments and engine pods as the API server sends them (~0.5 MB
    # for 8 engines); 1,000 ModelDeployments applied together would otherwise all hold theirs at
    # the same instant, and the process keeps that peak (the target: 300 MB at 1,000). A pass is
    # bound by its requests' latency (~1.5 s on a loaded API server), so 8 at once were too few:
    # 1,000 new ModelDeployments waited minutes for their first pass.
    max_concurrent_reconciles: int = 32
    # KVGATE_GATEWAY_GRACE_SECONDS: how long a gateway may keep routing to a NotReady engine pod
    # before the operator deletes the pod (smg 1.13 drains within ~1 s).
    gateway_grace_seconds: float = 15.0
    # KVGATE_MIN_ENGINE_VERSION_FLOOR: the cluster-wide engine version floor (chart value); no
    # ModelDeployment's requirement goes below it.
    min_engine_version_floor: str | None = None
    # KVGATE_GPUS_PER_NODE: the GPUs each GPU node has (chart value gpusPerNode); admission denies
    # an engine pod asking for more. None: unknown (only the 16-GPU ceiling applies).
    gpus_per_node: int | None = None
    # KVGATE_GPU_RESERVED_GIB_BY_PRODUCT: the reserve per GPU measured on the cluster's GPUs, by
    # nvidia.com/gpu.product (chart value estimator.gpuReservedGiBByProduct): admission and the
    # drift report estimate with it (kvgate.admission.gpu_reserve).
    gpu_reserved_gib_by_product: dict[str, float] = field(default_factory=dict)
    # KVGATE_MODEL_HOST_PATH_PREFIXES, KVGATE_RDMA_HOST_PATHS: the node directories a
    # ModelDeployment may mount (chart values hostPaths.*; kvgate.admission.host_paths).
    host_paths: HostPathPolicy | None = None
    # KVGATE_OPTIMISTIC_DRIFT_PERCENT: a verified engine's live pool this far below the admission
    # estimate makes the estimate "optimistic" (status, Event, alert; kvgate.rollout.pool_drift).
    optimistic_drift_percent: float = 10.0
    # KVGATE_ROUTER_KEY_SEED: secret seed of every router's control-plane key (router_auth); the
    # chart keeps it in a Secret. Unset: a random seed per process (routers are re-keyed on the
    # next start), for runs outside the chart.
    router_key_seed: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    # KVGATE_WORKER_AUDIT_SECONDS: how often each router's workers are compared with the verified
    # engine pods of its revision (unknown ones are removed).
    worker_audit_seconds: float = 2.0
    # KVGATE_WORKER_AUDIT_READS_PER_SECOND: router reads of the audit across the whole fleet.
    # Up to 2 x this many routers each is audited every KVGATE_WORKER_AUDIT_SECONDS; beyond,
    # the period stretches to routers / this (1,000 routers at 50/s: every 20 s) instead of
    # the operator spending a core on 500 reads a second.
    worker_audit_reads_per_second: float = 50.0
    # KVGATE_REVERIFY_READS_PER_SECOND: periodic engine re-verifications across the whole fleet.
    # A read that follows a change (first sighting, new IP, readiness, restart) never waits for
    # this budget; the periodic ones take turns at most this many a second, so up to
    # this x interval engines (100 x 30 s: 3,000) are each re-read every interval, and beyond
    # that every engines / this seconds (8,000 engines: every 80 s) instead of the operator
    # spending its CPU on re-reading unchanged engines while restarts and new ModelDeployments
    # wait (kvgate_reverify_wait_seconds shows the wait; docs/design/scale.md).
    reverify_reads_per_second: float = 100.0
    # KVGATE_NETWORK_POLICIES (+ KVGATE_OPERATOR_NAMESPACE/_POD_LABELS, KVGATE_ROUTER_EGRESS_*):
    # per-revision NetworkPolicies (kvgate.objects.network_policy); None = off.
    network_policy: NetworkPolicySettings | None = None
    # KVGATE_GUARD_IMAGE: the image of the guard sidecar every engine pod carries (kvgate.cmd.guard;
    # the chart sets the operator's own image). Unset (kvgate run outside its chart): engine pods
    # get no guard, and only the gate decides, which goes stale while the operator is down.
    guard_image: str | None = None
    # KVGATE_GUARD_RESOURCES: the guard sidecar's requests and limits (chart value
    # guard.resources); None: kvgate.objects.builders.GUARD_RESOURCES.
    guard_resources: dict[str, dict[str, str]] | None = None
    # KVGATE_ENGINE_IMAGE_PULL_SECRETS: the chart's imagePullSecrets, added to every engine pod's
    # own (the guard and the model download run the operator's image).
    engine_pull_secrets: tuple[str, ...] = ()
    # --leader-elect: run kopf only while holding this Lease (kvgate.kube.leader); None = always run
    # (one replica, or tests).
    leader_election: LeaderConfig | None = None
    log_format: str = "json"  # KVGATE_LOG_FORMAT: json | text
    log_level: str = "INFO"  # KVGATE_LOG_LEVEL

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OperatorSettings:
        return cls(
            namespaces=tuple(args.namespace or ()),
            standalone=bool(args.standalone),
            metrics_port=int(args.metrics_port),
            health_port=int(args.health_port),
            webhook_port=int(args.webhook_port),
            tls_dir=args.tls_dir,
            webhook=not args.no_webhook,
            bind_address=bind_address(),
            reconcile_seconds=_env_seconds("KVGATE_RECONCILE_SECONDS", 5.0),
            steady_reconcile_seconds=_env_seconds("KVGATE_STEADY_RECONCILE_SECONDS", 36_000.0),
            reverify_seconds=_env_seconds_or_none(
                "KVGATE_REVERIFY_SECONDS",
                MIN_PERIOD_SECONDS,
                "each ModelDeployment's rollout.reverifyIntervalSeconds",
            ),
            probe_timeout_seconds=_env_seconds("KVGATE_PROBE_TIMEOUT_SECONDS", 5.0),
            max_concurrent_probes=_env_count("KVGATE_MAX_CONCURRENT_PROBES", 16),
            max_concurrent_reconciles=_env_count("KVGATE_MAX_CONCURRENT_RECONCILES", 32),
            gateway_grace_seconds=_env_seconds("KVGATE_GATEWAY_GRACE_SECONDS", 15.0, minimum=0),
            # Checked in main.run (exit 2 naming the chart value engineVersionFloor).
            min_engine_version_floor=env("KVGATE_MIN_ENGINE_VERSION_FLOOR"),
            gpus_per_node=_gpus_per_node(),
            gpu_reserved_gib_by_product=_gpu_reserves(),
            host_paths=_host_paths(),
            optimistic_drift_percent=_optimistic_drift_percent(),
            router_key_seed=_router_key_seed(),
            worker_audit_seconds=_env_seconds("KVGATE_WORKER_AUDIT_SECONDS", 2.0),
            worker_audit_reads_per_second=_env_rate("KVGATE_WORKER_AUDIT_READS_PER_SECOND", 50.0),
            reverify_reads_per_second=_env_rate("KVGATE_REVERIFY_READS_PER_SECOND", 100.0),
            network_policy=network_policy_settings(os.environ),
            guard_image=_guard_image(),
            guard_resources=_guard_resources(),
            engine_pull_secrets=_pull_secrets(),
            leader_election=leader_config(bool(getattr(args, "leader_elect", False))),
            log_format=env_choice("KVGATE_LOG_FORMAT", LOG_FORMATS, "json"),
            log_level=env_choice("KVGATE_LOG_LEVEL", LOG_LEVELS, "INFO", upper=True),
        )
