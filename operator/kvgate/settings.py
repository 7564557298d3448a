"""Operator run-time settings: CLI flags plus a few environment overrides (one place to read)."""

from __future__ import annotations

import argparse
import os
import secrets
from dataclasses import dataclass, field

from kvgate.network_policy_settings import NetworkPolicySettings, network_policy_settings


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise SystemExit(
            f"{name}={raw!r} is not a number of seconds; unset it or use e.g. 2"
        ) from exc


def _env_count(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(
            f"{name}={raw!r} is not a whole number >= 1; unset it or use e.g. {default}"
        )
    return value


def _router_key_seed() -> bytes:
    raw = os.environ.get("KVGATE_ROUTER_KEY_SEED", "")
    if not raw:
        return secrets.token_bytes(32)
    if len(raw) < 16:
        raise SystemExit(
            f"KVGATE_ROUTER_KEY_SEED has {len(raw)} characters; use at least 16 random ones "
            "(the chart generates 48)"
        )
    return raw.encode()


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
    steady_reconcile_seconds: float = 30.0  # KVGATE_STEADY_RECONCILE_SECONDS
    reverify_seconds: float | None = None  # KVGATE_REVERIFY_SECONDS overrides the CR's interval
    probe_timeout_seconds: float = 5.0  # KVGATE_PROBE_TIMEOUT_SECONDS
    # KVGATE_MAX_CONCURRENT_PROBES: engine probes in flight at once, across every pod. A probe
    # holds at most 5 MiB of body (4 MiB /server_info + 1 MiB /v1/models), so 16 hold <= 80 MiB.
    max_concurrent_probes: int = 16
    # KVGATE_GATEWAY_GRACE_SECONDS: how long a gateway may keep routing to a NotReady engine pod
    # before the operator deletes the pod (smg 1.13 drains within ~1 s).
    gateway_grace_seconds: float = 15.0
    # KVGATE_MIN_ENGINE_VERSION_FLOOR: the cluster-wide engine version floor (chart value); no
    # ModelDeployment's requirement goes below it.
    min_engine_version_floor: str | None = None
    # KVGATE_ROUTER_KEY_SEED: secret seed of every router's control-plane key (router_auth); the
    # chart keeps it in a Secret. Unset: a random seed per process (routers are re-keyed on the
    # next start), for runs outside the chart.
    router_key_seed: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    # KVGATE_WORKER_AUDIT_SECONDS: how often each router's workers are compared with the verified
    # engine pods of its revision (unknown ones are removed).
    worker_audit_seconds: float = 2.0
    # KVGATE_NETWORK_POLICIES (+ KVGATE_OPERATOR_NAMESPACE/_POD_LABELS, KVGATE_ROUTER_EGRESS_*):
    # per-revision NetworkPolicies (kvgate.network_policy); None = off.
    network_policy: NetworkPolicySettings | None = None
    # KVGATE_GUARD_IMAGE: the image of the guard sidecar every engine pod carries (kvgate.guard;
    # the chart sets the operator's own image). Unset (kvgate run outside its chart): engine pods
    # get no guard, and only the gate decides, which goes stale while the operator is down.
    guard_image: str | None = None
    log_format: str = "json"  # KVGATE_LOG_FORMAT: json | text
    log_level: str = "INFO"  # KVGATE_LOG_LEVEL
    extra: dict[str, str] = field(default_factory=dict)

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
            bind_address=os.environ.get("KVGATE_BIND_ADDRESS", "0.0.0.0"),
            reconcile_seconds=_env_float("KVGATE_RECONCILE_SECONDS") or 5.0,
            steady_reconcile_seconds=_env_float("KVGATE_STEADY_RECONCILE_SECONDS") or 30.0,
            reverify_seconds=_env_float("KVGATE_REVERIFY_SECONDS"),
            probe_timeout_seconds=_env_float("KVGATE_PROBE_TIMEOUT_SECONDS") or 5.0,
            max_concurrent_probes=_env_count("KVGATE_MAX_CONCURRENT_PROBES", 16),
            gateway_grace_seconds=_env_float("KVGATE_GATEWAY_GRACE_SECONDS") or 15.0,
            min_engine_version_floor=os.environ.get("KVGATE_MIN_ENGINE_VERSION_FLOOR") or None,
            router_key_seed=_router_key_seed(),
            worker_audit_seconds=_env_float("KVGATE_WORKER_AUDIT_SECONDS") or 2.0,
            network_policy=network_policy_settings(os.environ),
            guard_image=os.environ.get("KVGATE_GUARD_IMAGE") or None,
            log_format=os.environ.get("KVGATE_LOG_FORMAT", "json"),
            log_level=os.environ.get("KVGATE_LOG_LEVEL", "INFO"),
        )
