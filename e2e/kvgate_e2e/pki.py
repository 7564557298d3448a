"""Per-run PKI for the e2e control plane, generated with ``cryptography``.

One CA signs the kube-apiserver serving certificate and one admin client certificate
(CN ``kvgate-admin``, O ``system:masters``) that the controller-manager, scheduler, kube-proxy,
loopback kubelet, kubectl, helm and the tests all use (kwok does the same). The ServiceAccount token
signing key pair is separate. As in kubeadm, a separate front-proxy CA signs the apiserver's
aggregation-layer client cert (CN ``front-proxy-client``), so the ``requestheader`` settings that
components and aggregated API servers read from ``extension-apiserver-authentication`` are set.
The apiserver reaches the loopback kubelet's HTTPS port (``pods/log``) with its own client
certificate (CN ``kube-apiserver-kubelet-client``, O ``system:masters``, as kubeadm's
``apiserver-kubelet-client``), and the kubelet serves with a certificate the same CA signs for its
nodes' InternalIPs (``issue_kubelet_serving``), which the apiserver verifies
(``--kubelet-certificate-authority``).
Keys are ECDSA P-256 (fast to generate) except the SA key, which is RSA-2048 so tokens are RS256
like a default cluster's. Everything lives only as long as the run.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from kvgate.kube.tls import CertificateAuthority, issue_certificate, make_ca

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
    kubelet_client_cert: Path
    kubelet_client_key: Path


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
KUBELET_CLIENT = "kube-apiserver-kubelet-client"


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
    kubelet_client = issue_certificate(
        ca,
        common_name=KUBELET_CLIENT,
        organization=ADMIN_GROUP,
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
        kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        kubelet_client_key=directory / "apiserver-kubelet-client.key",
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
    _write(paths.kubelet_client_cert, kubelet_client.cert_pem, 0o644)
    _write(paths.kubelet_client_key, kubelet_client.key_pem, 0o600)
    _write(paths.sa_key, _key_pem(sa_key), 0o600)
    _write(
        paths.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )
    return paths


def load_ca(cert_path: Path, key_path: Path) -> CertificateAuthority:
    """The run's CA from its PEM files (to sign more leaf certificates)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{key_path}: expected an EC private key, got {type(key).__name__}")
    return CertificateAuthority(cert, key)


@dataclass(frozen=True)
class KubeletServingFiles:
    cert: Path
    key: Path


def issue_kubelet_serving(
    ca: CertificateAuthority,
    directory: Path,
    *,
    node_names: Sequence[str],
    node_ips: Sequence[str],
) -> KubeletServingFiles:
    """A kubelet serving certificate for ``node_ips`` (and the node names), as the kubelet's
    ``serverTLSBootstrap`` certificate is (CN ``system:node:<first node>``, O ``system:nodes``)."""
    directory.mkdir(parents=True, exist_ok=True)
    serving = issue_certificate(
        ca,
        common_name=f"system:node:{node_names[0] if node_names else 'loopback'}",
        organization="system:nodes",
        dns_names=list(node_names),
        ip_addresses=list(node_ips),
        valid_days=_VALIDITY_DAYS,
    )
    files = KubeletServingFiles(directory / "kubelet.crt", directory / "kubelet.key")
    _write(files.cert, serving.cert_pem, 0o644)
    _write(files.key, serving.key_pem, 0o600)
    return files
