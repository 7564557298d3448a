"""The router's control-plane key: who may add, remove or list smg's workers (pure).

smg 1.13 serves its worker API (``/workers``, ``/flush_cache``, ...) on the same port as
inference, so anyone who can reach the ``<md>`` Service could ``POST /workers`` an engine kvgate
never verified. kvgate starts every router with ``--control-plane-api-keys`` holding one admin
key per ModelDeployment; smg then answers 401 to a worker call without it (measured: GET, POST,
DELETE /workers all 401). smg has no option to serve that API on another port.

The key is derived, not stored: HMAC-SHA256 of the operator's seed (a chart-generated Secret in the
operator's namespace) over the ModelDeployment's namespace, name and uid. The operator computes it
whenever it needs it (reading ``/workers``) and never reads it back from the cluster; the router
gets it from a Secret ``<md>-router-control`` that the operator creates and owns.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_KEY = "admin-key"
ENV_VAR = "KVGATE_ROUTER_ADMIN_KEY"
KEY_ID = "kvgate"  # smg's key id and name in its audit log
KEY_NAME = "kvgate-operator"


def control_key(seed: bytes, namespace: str, name: str, uid: str) -> str:
    """The admin key of one ModelDeployment's routers (hex, 64 characters)."""
    message = f"kvgate-router-control\x00{namespace}\x00{name}\x00{uid}".encode()
    return hmac.new(seed, message, hashlib.sha256).hexdigest()


def key_fingerprint(key: str) -> str:
    """A short one-way digest, put on the router's pod template so that a changed key (a new
    operator seed) rolls the routers onto it."""
    return hashlib.sha256(f"fingerprint\x00{key}".encode()).hexdigest()[:12]


def smg_key_argument() -> str:
    """The ``--control-plane-api-keys`` value; the kubelet expands ``$(VAR)`` from the env that
    reads the Secret, so the key itself never appears in the Deployment."""
    return f"{KEY_ID}:{KEY_NAME}:admin:$({ENV_VAR})"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
