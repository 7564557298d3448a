"""Certificates for the admission webhook, made with `cryptography`.

kopf's own self-signing needs oscrypto, which cannot load OpenSSL 3.0 here, so tests, the demo and
the e2e tier make a CA and a serving certificate with these functions and hand kopf the files.
Keys are ECDSA P-256: fast to generate and accepted by Go's TLS stack (the kube-apiserver).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"

# Backdating absorbs small clock differences between this process and the API server.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA whose certificate goes into the webhook's caBundle."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _private_pem(self.private_key)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class ServingCertificate:
    """A leaf certificate signed by `ca`, with its key."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey
    ca: CertificateAuthority

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _private_pem(self.private_key)


@dataclass(frozen=True)
class TlsFiles:
    """Where `write_tls_dir` put the files (names as in a kubernetes.io/tls Secret)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    common_name: str = "kvgate-webhook-ca",
    *,
    valid_days: int = 365,
    path_length: int | None = 0,
) -> CertificateAuthority:
    """A fresh self-signed CA (by default one that signs leaf certificates only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(certificate=certificate, private_key=key)


def issue_certificate(
    ca: CertificateAuthority,
    *,
    common_name: str,
    organization: str | None = None,
    usages: Sequence[x509.ObjectIdentifier] = (ExtendedKeyUsageOID.SERVER_AUTH,),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    valid_days: int = 365,
) -> ServingCertificate:
    """A leaf certificate signed by `ca`: a TLS server (default) or client certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        subject.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    certificate = builder.sign(ca.private_key, hashes.SHA256())
    return ServingCertificate(certificate=certificate, private_key=key, ca=ca)


def make_serving_cert(
    ca: CertificateAuthority,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    *,
    valid_days: int = 365,
) -> ServingCertificate:
    """A TLS server certificate for the given names, signed by `ca`.

    The API server verifies the webhook by SAN only (no CommonName fallback), so every name a
    client uses — `kvgate-webhook.kvgate-system.svc`, an IP — must be listed here.
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    return issue_certificate(
        ca,
        common_name=dns_names[0] if dns_names else ip_addresses[0],
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        valid_days=valid_days,
    )


def write_tls_dir(directory: str | Path, serving: ServingCertificate) -> TlsFiles:
    """Write tls.crt, tls.key (mode 0600) and ca.crt into `directory` (created if absent)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(cert_file=root / CERT_FILE, key_file=root / KEY_FILE, ca_file=root / CA_FILE)
    files.key_file.touch(mode=0o600)
    files.key_file.chmod(0o600)
    files.key_file.write_bytes(serving.key_pem)
    files.cert_file.write_bytes(serving.cert_pem)
    files.ca_file.write_bytes(serving.ca.cert_pem)
    return files
