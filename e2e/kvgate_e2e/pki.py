"""Per-run PKI for the e2e control plane, generated with ``cryptography``.

One CA signs the kube-apiserver serving certificate and one admin client certificate
(CN ``kvgate-admin``, O ``system:masters``) that the controller-manager, scheduler, kube-proxy,
loopback kubelet, kubectl, helm and the tests all use (kwok does the same). The ServiceAccount token
signing key pair is separate. As in kubeadm, a separate front-proxy CA signs the apiserver's
aggregation-layer client cert (CN ``front-proxy-client``), so the ``requestheader`` settings that
components and aggregated API servers read from ``extension-apiserver-authentication`` are set.
Keys are ECDSA P-256 (fast to generate) except the SA key, which is RSA-2048 so tokens are RS256
like a default cluster's. Everything lives only as long as the run.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from kvgate.tls import issue_certificate, make_ca

ADMIN_USER = "kvgate-admin"
ADMIN_GROUP = "system:masters"
_VALIDITY_DAYS = 2


@dataclass(frozen=True)
class PkiPaths:
    """Where the run's PKI files are. All PEM."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    path.touch(mode=mode)
    path.chmod(mode)
    path.write_bytes(data)


def apiserver_sans(
    service_ip: ipaddress.IPv4Address,
    extra_ips: Sequence[ipaddress.IPv4Address] = (),
    cluster_domain: str = "cluster.local",
) -> tuple[list[str], list[str]]:
    """(DNS names, IPs) under which clients reach the apiserver: loopback, the advertise address
    and the ``kubernetes`` Service (by ClusterIP and by every DNS form of its name)."""
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{cluster_domain}",
    ]
    ips = [ipaddress.IPv4Address("127.0.0.1"), service_ip, *extra_ips]
    return dns, [str(ip) for ip in dict.fromkeys(ips)]


FRONT_PROXY_CLIENT = "front-proxy-client"


def generate_pki(
    directory: Path,
    *,
    service_ip: ipaddress.IPv4Address,
    apiserver_ips: Sequence[ipaddress.IPv4Address] = (),
    cluster_domain: str = "cluster.local",
) -> PkiPaths:
    """Write a fresh CA, apiserver serving cert, admin client cert and SA key pair to
    ``directory`` and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("kvgate-e2e-ca", valid_days=_VALIDITY_DAYS, path_length=None)
    front_proxy_ca = make_ca(
        "kvgate-e2e-front-proxy-ca", valid_days=_VALIDITY_DAYS, path_length=None
    )
    dns, ips = apiserver_sans(service_ip, apiserver_ips, cluster_domain)
    apiserver = issue_certificate(
        ca,
        common_name="kube-apiserver",
        dns_names=dns,
        ip_addresses=ips,
        valid_days=_VALIDITY_DAYS,
    )
    admin = issue_certificate(
        ca,
        common_name=ADMIN_USER,
        organization=ADMIN_GROUP,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        valid_days=_VALIDITY_DAYS,
    )
    front_proxy = issue_certificate(
        front_proxy_ca,
        common_name=FRONT_PROXY_CLIENT,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        valid_days=_VALIDITY_DAYS,
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    paths = PkiPaths(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        apiserver_cert=directory / "apiserver.crt",
        apiserver_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_client_cert=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
    )
    _write(paths.ca_cert, ca.cert_pem, 0o644)
    _write(paths.ca_key, ca.key_pem, 0o600)
    _write(paths.apiserver_cert, apiserver.cert_pem, 0o644)
    _write(paths.apiserver_key, apiserver.key_pem, 0o600)
    _write(paths.admin_cert, admin.cert_pem, 0o644)
    _write(paths.admin_key, admin.key_pem, 0o600)
    _write(paths.front_proxy_ca_cert, front_proxy_ca.cert_pem, 0o644)
    _write(paths.front_proxy_client_cert, front_proxy.cert_pem, 0o644)
    _write(paths.front_proxy_client_key, front_proxy.key_pem, 0o600)
    _write(paths.sa_key, _key_pem(sa_key), 0o600)
    _write(
        paths.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )
    return paths
