"""Which smg flags `spec.router.args` may not carry. Pure.

kvgate appends `router.args` after its own flags, and smg's parser (argparse) keeps the last
value, so an extra flag can replace kvgate's choices. Denied: flags that give the router workers
kvgate did not verify (static URLs, another discovery source, another namespace or selector,
mesh peers, multi-model or RL control planes), that change who may use its control plane or
API, and where it listens. Everything else (routing policy, timeouts, logging, limits) is the
tenant's to tune.

argparse accepts any unique prefix of a flag (`--worker-u` is `--worker-urls`; smg's parser keeps
`allow_abbrev=True`), and `--flag=value` as well as `--flag value`. So an argument is denied when
the part before `=` is a prefix of a denied flag, as :func:`kvgate_engine.flag_reader.named_flags`
reads it (the reader engine.args are checked with). Each argument is read on its own, those after
a `--` too: smg takes no positional argument and refuses to start with one, so a denied flag
there is denied rather than left to a crash loop. No flag smg accepts is itself a prefix of a
denied one (tests/admission/test_inputs.py asks smg's own parser), so nothing allowed is caught.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate_engine.flag_reader import named_flags, spelled_flag

_VERIFIED = "kvgate points the router at this revision's verified prefill and decode pods itself"
_WORKERS = ("adds workers kvgate did not verify", _VERIFIED)
_DISCOVERY = ("changes which engine pods the router discovers and pairs", _VERIFIED)
_CONTROL = ("opens another control plane on the router's serving port", "")
_AUTH = (
    "changes who may use the router's control plane or API, which kvgate manages (it must reach "
    "the router's /workers)",
    "to protect the endpoint, put an authenticating proxy in front of the Service",
)
_LISTEN = (
    "changes where or how the router listens or reaches engines, which kvgate sets",
    "set spec.router.port for the port",
)
_METRICS = (
    "moves the router's Prometheus listener, which kvgate reads on port 29000 for the "
    "progressive step check",
    "scrape the routers on their metrics port (29000)",
)

# flag -> (why it is denied, what to do instead) (smg 1.13, `smg launch --help`).
DENIED_ROUTER_FLAGS: Mapping[str, tuple[str, str]] = {
    "--worker-urls": _WORKERS,
    "--prefill": _WORKERS,
    "--decode": _WORKERS,
    "--encode": _WORKERS,
    "--epd-disaggregation": _WORKERS,
    "--discovery-file": _WORKERS,
    "--service-discovery": _DISCOVERY,
    "--discovery-provider": _DISCOVERY,
    "--discovery-check-interval-secs": _DISCOVERY,
    "--selector": _DISCOVERY,
    "--service-discovery-port": _DISCOVERY,
    "--service-discovery-namespace": _DISCOVERY,
    "--prefill-selector": _DISCOVERY,
    "--decode-selector": _DISCOVERY,
    "--encode-selector": _DISCOVERY,
    "--router-selector": _DISCOVERY,
    "--enable-mesh": _WORKERS,
    "--mesh-server-name": _WORKERS,
    "--mesh-host": _WORKERS,
    "--mesh-advertise-host": _WORKERS,
    "--mesh-port": _WORKERS,
    "--mesh-peer-urls": _WORKERS,
    "--mesh-tls-ca-cert": _WORKERS,
    "--mesh-tls-cert": _WORKERS,
    "--mesh-tls-key": _WORKERS,
    "--enable-igw": _CONTROL,
    "--enable-rl": _CONTROL,
    "--control-plane-api-keys": _AUTH,
    "--api-key": _AUTH,
    "--tenant-api-key": _AUTH,
    "--jwt-issuer": _AUTH,
    "--jwt-audience": _AUTH,
    "--jwt-jwks-uri": _AUTH,
    "--jwt-role-mapping": _AUTH,
    "--host": _LISTEN,
    "--port": _LISTEN,
    "--health-check-port": _LISTEN,
    "--tls-cert-path": _LISTEN,
    "--tls-key-path": _LISTEN,
    "--client-cert-path": _LISTEN,
    "--client-key-path": _LISTEN,
    "--ca-cert-paths": _LISTEN,
    "--prometheus-port": _METRICS,
}


def denied_flag(arg: str) -> str | None:
    """The denied flag smg would read `arg` as (exactly or as an abbreviation), else None."""
    named = named_flags(arg, DENIED_ROUTER_FLAGS)
    return named[0] if named else None


def denial_message(arg: str, flag: str) -> str:
    """Why `arg` is denied and what to do instead."""
    spelled = spelled_flag(arg) or arg
    if spelled != flag:
        spelled += f" (a prefix of {flag}; smg's parser accepts any unique prefix of a flag)"
    why, instead = DENIED_ROUTER_FLAGS[flag]
    return f"{spelled} {why}; remove it from spec.router.args" + (f"; {instead}" if instead else "")
