"""`kvgate webhook`: the validating webhook as its own server (its own Deployment in the chart).

    kvgate webhook --port=9443 --health-port=8081 --metrics-port=8080 --tls-dir=/tls
                   [--shutdown-delay-seconds=5]

- HTTPS on --port: POST /validate-modeldeployment (`kvgate.webhook.app`), with tls.crt and
  tls.key from --tls-dir, re-read when they change.
- Plain HTTP on --health-port: /healthz (200 while the process serves) and /readyz (200 until
  SIGTERM, then 503).
- Prometheus metrics on --metrics-port: /metrics (`kvgate.webhook.metrics`).

Environment: KVGATE_BIND_ADDRESS (default 0.0.0.0), KVGATE_MIN_ENGINE_VERSION_FLOOR (the chart
value engineVersionFloor), KVGATE_MODEL_HOST_PATH_PREFIXES and KVGATE_RDMA_HOST_PATHS (JSON lists,
the chart values hostPaths.modelPrefixes and hostPaths.rdmaDevices), KVGATE_LOG_LEVEL,
KVGATE_LOG_FORMAT (json | text).

On SIGTERM (or SIGINT) readiness fails at once while admissions are still answered for
--shutdown-delay-seconds, long enough for the Service to drop the pod; then the server stops
accepting, finishes the requests in flight and exits 0. Exit 2: a setting is wrong (the message
names it) or the certificate files cannot be loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import math
import signal
import sys
from dataclasses import dataclass

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvgate.admission.gpu_reserve import RESERVES_ENV, parse_reserves
from kvgate.admission.host_paths import MODEL_PREFIXES_ENV, RDMA_DEVICES_ENV, host_path_policy
from kvgate.admission.policy import (
    FLOOR_SETTING,
    GPUS_PER_NODE_ENV,
    ClusterPolicy,
    parse_gpus_per_node,
)
from kvgate.kube.settings import LOG_FORMATS, LOG_LEVELS, bind_address, env, env_choice
from kvgate.webhook import metrics
from kvgate.webhook.app import AdmissionServer
from kvgate.webhook.certificates import CertificateFilesError, ReloadingCertificate

log = logging.getLogger("kvgate.admission.webhook")

EXIT_OK = 0
EXIT_USAGE = 2
FLOOR_ENV = "KVGATE_MIN_ENGINE_VERSION_FLOOR"


@dataclass(frozen=True)
class WebhookSettings:
    """Everything `kvgate webhook` runs with, from its flags and KVGATE_* variables."""

    port: int
    health_port: int
    metrics_port: int
    tls_dir: str
    shutdown_delay_seconds: float
    bind_address: str
    policy: ClusterPolicy
    log_level: str
    log_format: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WebhookSettings:
        """Raises SystemExit(message) for a wrong KVGATE_* value, ValueError for a wrong flag."""
        for flag, port in (
            ("--port", args.port),
            ("--health-port", args.health_port),
            ("--metrics-port", args.metrics_port),
        ):
            if not 1 <= port <= 65535:
                raise ValueError(f"{flag} {port}: must be a TCP port, 1-65535")
        if len({args.port, args.health_port, args.metrics_port}) != 3:
            raise ValueError(
                f"--port {args.port}, --health-port {args.health_port} and --metrics-port "
                f"{args.metrics_port} must be three different ports"
            )
        delay = args.shutdown_delay_seconds
        if not (math.isfinite(delay) and delay >= 0):
            raise ValueError(f"--shutdown-delay-seconds {delay}: must be a number of seconds >= 0")
        floor = env(FLOOR_ENV)
        try:
            gpus_per_node = parse_gpus_per_node(env(GPUS_PER_NODE_ENV))
        except ValueError as error:
            raise SystemExit(str(error)) from None
        try:
            reserves = parse_reserves(env(RESERVES_ENV))
            host_paths = host_path_policy(env(MODEL_PREFIXES_ENV), env(RDMA_DEVICES_ENV))
        except ValueError as error:
            raise SystemExit(str(error)) from None
        try:
            policy = ClusterPolicy(
                min_engine_version_floor=floor,
                gpus_per_node=gpus_per_node,
                gpu_reserved_gib_by_product=reserves,
                host_paths=host_paths,
            )
        except ValueError as error:
            raise SystemExit(f"{FLOOR_ENV} (the chart value {FLOOR_SETTING}): {error}") from None
        return cls(
            port=args.port,
            health_port=args.health_port,
            metrics_port=args.metrics_port,
            tls_dir=args.tls_dir,
            shutdown_delay_seconds=delay,
            bind_address=bind_address(),
            policy=policy,
            log_level=env_choice("KVGATE_LOG_LEVEL", LOG_LEVELS, "INFO", upper=True),
            log_format=env_choice("KVGATE_LOG_FORMAT", LOG_FORMATS, "json"),
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the record's `extra` fields."""

    _STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(
            (key, value) for key, value in vars(record).items() if key not in self._STANDARD
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(settings: WebhookSettings) -> None:
    handler = logging.StreamHandler(sys.stdout)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("kvgate").setLevel(settings.log_level)


class ProbeEndpoints:
    """/healthz, /readyz and /metrics over plain HTTP."""

    def __init__(self, server: AdmissionServer) -> None:
        self.server = server

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        if self.server.draining:
            return web.Response(status=503, text="draining: shutting down\n")
        return web.Response(text="ok\n")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


async def _start_http(routes: list[web.RouteDef], host: str, port: int) -> web.AppRunner:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def serve(settings: WebhookSettings, certificate: ReloadingCertificate) -> None:
    """Serve until SIGTERM or SIGINT, then drain (see the module doc)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = AdmissionServer(
        certificate=certificate,
        policy=settings.policy,
        host=settings.bind_address,
        port=settings.port,
    )
    probes = ProbeEndpoints(server)
    host = settings.bind_address
    await server.start()
    health = await _start_http(
        [web.get("/healthz", probes.healthz), web.get("/readyz", probes.readyz)],
        host,
        settings.health_port,
    )
    metrics_runner = await _start_http(
        [web.get("/metrics", probes.metrics)], host, settings.metrics_port
    )
    log.info(
        "kvgate webhook serving",
        extra={
            "webhook": f"{server.url}/validate-modeldeployment",
            "health_port": settings.health_port,
            "metrics_port": settings.metrics_port,
            "tls_dir": settings.tls_dir,
            "engine_version_floor": settings.policy.min_engine_version_floor,
        },
    )
    try:
        await stop.wait()
        server.begin_drain()
        log.info(
            "shutting down: readiness fails now; answering admissions for %g s more",
            settings.shutdown_delay_seconds,
        )
        await asyncio.sleep(settings.shutdown_delay_seconds)
        await server.stop()
        log.info("kvgate webhook stopped")
    finally:
        await server.stop()  # no-op after a clean stop
        await health.cleanup()
        await metrics_runner.cleanup()


def main(args: argparse.Namespace) -> int:
    """`kvgate webhook`."""
    try:
        settings = WebhookSettings.from_args(args)
    except (ValueError, SystemExit) as error:
        print(f"kvgate webhook: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        certificate = ReloadingCertificate(settings.tls_dir)
    except CertificateFilesError as error:
        print(f"kvgate webhook: {error}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings)
    # uvloop: a third less CPU per admission than asyncio's loop and TLS (README, Measured).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(settings, certificate))
    return EXIT_OK
