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

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ADMIN_USER = "kvgate-admin"
ADMIN_GROUP = "system:masters"
_VALIDITY = dt.timedelta(days=2)
_BACKDATE = dt.timedelta(hours=1)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


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


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int) -> None:
    path.write_bytes(data)
    path.chmod(mode)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
    )


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    subject: x509.Name,
    eku: Sequence[x509.ObjectIdentifier],
    san: x509.SubjectAlternativeName | None,
    now: dt.datetime,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _ec_key()
    b = (
        _builder(subject, ca_cert.subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(eku)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if san is not None:
        b = b.add_extension(san, critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


def apiserver_sans(
    service_ip: ipaddress.IPv4Address,
    extra_ips: Sequence[ipaddress.IPv4Address] = (),
    cluster_domain: str = "cluster.local",
) -> x509.SubjectAlternativeName:
    """SANs under which clients reach the apiserver: loopback, the advertise address and the
    ``kubernetes`` Service (by ClusterIP and by every DNS form of its name)."""
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{cluster_domain}",
    ]
    ips = [ipaddress.IPv4Address("127.0.0.1"), service_ip, *extra_ips]
    unique_ips = list(dict.fromkeys(ips))
    return x509.SubjectAlternativeName(
        [x509.DNSName(d) for d in dns] + [x509.IPAddress(ip) for ip in unique_ips]
    )


def _ca(cn: str, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _ec_key()
    name = _name(cn)
    cert = (
        _builder(name, name, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


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
    now = dt.datetime.now(dt.UTC)

    ca_key, ca_cert = _ca("kvgate-e2e-ca", now)
    fp_ca_key, fp_ca_cert = _ca("kvgate-e2e-front-proxy-ca", now)
    srv_key, srv_cert = _leaf(
        ca_key,
        ca_cert,
        _name("kube-apiserver"),
        [ExtendedKeyUsageOID.SERVER_AUTH],
        apiserver_sans(service_ip, apiserver_ips, cluster_domain),
        now,
    )
    adm_key, adm_cert = _leaf(
        ca_key,
        ca_cert,
        _name(ADMIN_USER, ADMIN_GROUP),
        [ExtendedKeyUsageOID.CLIENT_AUTH],
        None,
        now,
    )
    fp_key, fp_cert = _leaf(
        fp_ca_key,
        fp_ca_cert,
        _name(FRONT_PROXY_CLIENT),
        [ExtendedKeyUsageOID.CLIENT_AUTH],
        None,
        now,
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
    _write(paths.ca_cert, _cert_pem(ca_cert), 0o644)
    _write(paths.ca_key, _key_pem(ca_key), 0o600)
    _write(paths.apiserver_cert, _cert_pem(srv_cert), 0o644)
    _write(paths.apiserver_key, _key_pem(srv_key), 0o600)
    _write(paths.admin_cert, _cert_pem(adm_cert), 0o644)
    _write(paths.admin_key, _key_pem(adm_key), 0o600)
    _write(paths.front_proxy_ca_cert, _cert_pem(fp_ca_cert), 0o644)
    _write(paths.front_proxy_client_cert, _cert_pem(fp_cert), 0o644)
    _write(paths.front_proxy_client_key, _key_pem(fp_key), 0o600)
    _write(paths.sa_key, _key_pem(sa_key), 0o600)
    _write(
        paths.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )
    return paths
