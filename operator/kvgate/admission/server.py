"""The HTTPS server for the validating webhook: kopf's `WebhookServer` from certificate files,
with a guard in front of kopf's request handling.

The guard (see `kvgate.admission.review`) answers 4xx for bodies kopf would turn into a 500 or
allow by accident (a path with no handler). Everything that passes goes to kopf's own
`serve_admission_request`, which runs the `@kopf.on.validate` handler.

kopf's self-signed certificates need oscrypto, which fails with this OpenSSL: certificates always
come from files (a mounted kubernetes.io/tls Secret, or `kvgate.tls.write_tls_dir`). kopf re-reads
them when they change, so rotation needs no restart.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any, cast

import aiohttp.web
import kopf
from kopf._cogs.structs import reviews
from kopf._core.engines import admission as kopf_admission

from kvgate.admission.review import RejectedReview, check_review, parse_review
from kvgate.admission.webhook import HANDLER_ID
from kvgate.tls import CA_FILE, CERT_FILE, KEY_FILE

logger = logging.getLogger(__name__)

# The API server gives a webhook at most 30 s; certificates are re-read this often.
CERT_CHECK_INTERVAL_SECONDS = 30.0
INTERNAL_ERROR_CODE = 500


class GuardedWebhookServer(kopf.WebhookServer):
    """`kopf.WebhookServer` that rejects malformed requests with a 4xx before kopf sees them.

    Overrides kopf 1.45's `WebhookServer._serve` (the per-request aiohttp handler); the
    listening, TLS and certificate-reload logic stay kopf's. tests/admission/test_webhook_https.py
    proves the behaviour end to end, so a kopf upgrade that changes `_serve` fails there.
    """

    def __init__(self, *, handler_ids: Collection[str] = (HANDLER_ID,), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handler_ids = frozenset(handler_ids)

    # kopf declares _serve a staticmethod; this one needs the server's handler ids.
    async def _serve(  # type: ignore[override]
        self, fn: kopf.WebhookFn, request: aiohttp.web.Request
    ) -> aiohttp.web.Response:
        webhook = request.match_info.get("id")
        try:
            data = parse_review(await request.read())
            check_review(data, webhook, self.handler_ids)
        except RejectedReview as rejected:
            return aiohttp.web.json_response({"error": rejected.message}, status=rejected.status)

        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            response = await fn(
                cast(reviews.Request, data), webhook=webhook, sslpeer=sslpeer, headers=headers
            )
        except kopf_admission.AmbiguousResourceError as error:
            return aiohttp.web.json_response({"error": str(error)}, status=409)
        except kopf_admission.UnknownResourceError as error:
            return aiohttp.web.json_response({"error": str(error)}, status=404)
        except kopf_admission.WebhookError as error:
            return aiohttp.web.json_response({"error": str(error)}, status=400)
        except Exception as error:
            # A failure inside kopf's plumbing: deny (never allow what was not checked).
            logger.exception("Admission request failed inside the webhook machinery")
            return aiohttp.web.json_response(_denial(data, f"{type(error).__name__}: {error}"))
        return aiohttp.web.json_response(response)


def _denial(data: dict[str, Any], detail: str) -> dict[str, Any]:
    request = data.get("request") if isinstance(data.get("request"), dict) else {}
    return {
        "apiVersion": data.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": {
            "uid": request.get("uid", "") if isinstance(request, dict) else "",
            "allowed": False,
            "status": {
                "code": INTERNAL_ERROR_CODE,
                "message": f"kvgate could not check this request ({detail}); this is a kvgate "
                "bug, please report it",
            },
        },
    }


def build_webhook_server(
    *, tls_dir: str | Path, port: int, addr: str = "127.0.0.1", host: str | None = None
) -> GuardedWebhookServer:
    """The webhook server for tls.crt/tls.key (and ca.crt, when present) in `tls_dir`."""
    root = Path(tls_dir)
    cert_file, key_file, ca_file = root / CERT_FILE, root / KEY_FILE, root / CA_FILE
    for path in (cert_file, key_file):
        if not path.is_file():
            raise FileNotFoundError(
                f"webhook certificate file {path} is missing; mount a kubernetes.io/tls Secret "
                f"at {root} or create one with kvgate.tls.write_tls_dir"
            )
    return GuardedWebhookServer(
        addr=addr,
        port=port,
        host=host,
        certfile=str(cert_file),
        pkeyfile=str(key_file),
        cafile=str(ca_file) if ca_file.is_file() else None,
        file_check_interval=CERT_CHECK_INTERVAL_SECONDS,
    )


def configure_webhook_server(
    settings: kopf.OperatorSettings,
    *,
    port: int,
    tls_dir: str | Path,
    addr: str = "127.0.0.1",
    host: str | None = None,
) -> None:
    """Serve the validating webhook from the operator (call from a `@kopf.on.startup` handler).

    kopf does not manage the ValidatingWebhookConfiguration: the Helm chart (or the e2e tier, via
    `kvgate.admission.registration`) ships it with a service reference and the CA bundle.
    In a pod, pass addr="0.0.0.0" so the Service can reach it.
    """
    settings.admission.server = build_webhook_server(
        tls_dir=tls_dir, port=port, addr=addr, host=host
    )
    settings.admission.managed = None
