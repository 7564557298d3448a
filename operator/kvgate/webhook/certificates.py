"""The webhook's serving certificate, from tls.crt and tls.key in a directory, followed as the
files change (cert-manager renews the Secret, the kubelet swaps the mounted files) without a
restart.

Every TLS handshake asks the listening context's SNI callback for the context to use (OpenSSL
calls it with or without a server name), and the callback hands out the newest one. A watcher
re-reads the files every `check_interval` seconds and builds a new context only when their
bytes changed; files that do not load (half-written, a key that does not match) leave the last
good certificate in place until they do.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from pathlib import Path

from kvgate.kube.tls import CERT_FILE, KEY_FILE

log = logging.getLogger("kvgate.webhook.certificates")

# cert-manager renews well before expiry; the kubelet updates a mounted Secret within ~1 min.
CHECK_INTERVAL_SECONDS = 30.0


class CertificateFilesError(Exception):
    """tls.crt or tls.key is missing or unreadable: the message names the path and the fix."""


def _server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


class ReloadingCertificate:
    """The listening `context` for the HTTPS server; it serves the newest loadable certificate."""

    def __init__(self, tls_dir: str | Path, *, check_interval: float = CHECK_INTERVAL_SECONDS):
        self.tls_dir = Path(tls_dir)
        self.cert_file = self.tls_dir / CERT_FILE
        self.key_file = self.tls_dir / KEY_FILE
        self.check_interval = check_interval
        self.reloads = 0  # certificates loaded after the first (for logs and tests)
        digest = self._digest()
        try:
            self._current = _server_context(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise CertificateFilesError(
                f"cannot load the webhook certificate {self.cert_file} with key "
                f"{self.key_file}: {error}; the Secret must hold a PEM certificate (tls.crt) "
                "and its private key (tls.key)"
            ) from None
        self._digest_loaded = digest
        self.context = _server_context(self.cert_file, self.key_file)
        self.context.sni_callback = self._pick_context

    def _digest(self) -> bytes:
        hasher = hashlib.sha256()
        for path in (self.cert_file, self.key_file):
            try:
                hasher.update(path.read_bytes())
            except FileNotFoundError:
                raise CertificateFilesError(
                    f"webhook certificate file {path} is missing; mount the webhook's "
                    f"kubernetes.io/tls Secret at {self.tls_dir} (--tls-dir), or create "
                    "tls.crt and tls.key there (kvgate.kube.tls.write_tls_dir)"
                ) from None
            except OSError as error:
                raise CertificateFilesError(
                    f"cannot read webhook certificate file {path}: {error}; check the "
                    f"Secret mounted at {self.tls_dir} (--tls-dir)"
                ) from None
        return hasher.digest()

    def _pick_context(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        ssl_object.context = self._current

    def reload_if_changed(self) -> bool:
        """Load the files if their bytes changed since the last load; True when it did.
        Raises CertificateFilesError (the old certificate stays) when they do not load."""
        digest = self._digest()
        if digest == self._digest_loaded:
            return False
        try:
            context = _server_context(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise CertificateFilesError(
                f"the changed webhook certificate {self.cert_file} (key {self.key_file}) does "
                f"not load: {error}; still serving the previous one"
            ) from None
        self._current, self._digest_loaded = context, digest
        self.reloads += 1
        return True

    async def watch(self) -> None:
        """Reload whenever the files change, until cancelled."""
        while True:
            await asyncio.sleep(self.check_interval)
            try:
                if self.reload_if_changed():
                    log.info("webhook certificate reloaded from %s", self.cert_file)
            except CertificateFilesError as error:
                log.error("%s", error)
