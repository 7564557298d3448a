"""A tenant tries to override kvgate's own engine flags through ``spec.engine.args``.

kvgate appends ``engine.args`` after the flags it sets, and SGLang's parser keeps the last value,
accepts any unique prefix of a flag and ``--flag=value``. A tenant who may edit ModelDeployments
in their namespace (``make_tenant``: the ``edit`` ClusterRole there) applies one with a flag that
would replace kvgate's, spelled the ways SGLang reads it: the KV cache dtype and the KV canary
abbreviated, the context window (the incident's shape: engines accepting prompts longer than
their pools), and a pool cap out of the admission estimate's sight. Each is denied by kvgate's
webhook, naming ``spec.engine.args[i]``, what was written, the SGLang flag it is read as and the
spec field to set instead; nothing is stored. The same ModelDeployment with tuning flags only is
admitted (server-side dry run), so the denials are the webhook's, not the tenant's rights.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_engine_args.py -v -s`` (root).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kvgate_e2e.world import World
from scenario_helpers import Tenant, make_tenant, sample_md

pytestmark = pytest.mark.e2e

WEBHOOK = 'admission webhook "validate-modeldeployment.kvgate.io" denied the request'
TUNING = ["--log-level", "info", "--chunked-prefill-size", "4096"]
UNIQUE_PREFIX = "SGLang's parser accepts any unique prefix of a flag"
KV_DTYPE = "spec.engine.kvCacheDtype"

# (what the tenant appends to engine.args, what the denial says it is read as, the field instead)
OVERRIDES: list[tuple[list[str], str, str]] = [
    (["--kv-cache-dt", "float16"], f"--kv-cache-dtype ({UNIQUE_PREFIX})", KV_DTYPE),
    (["--kv-cache-d=float16"], f"--kv-cache-dtype ({UNIQUE_PREFIX})", KV_DTYPE),
    (["--kv-can", "bogus"], f"--kv-canary ({UNIQUE_PREFIX})", "spec.safety.kvCanary"),
    (["--context-length", "131072"], "--context-length", "spec.model.contextLength"),
    (["--context-len=131072"], f"--context-length ({UNIQUE_PREFIX})", "spec.model.contextLength"),
    (["--max-total-tokens", "1024"], "--max-total-tokens", "spec.prefill.maxTotalTokens"),
]


def with_engine_args(name: str, args: list[str]) -> dict[str, Any]:
    md = sample_md(name)
    md["spec"]["engine"]["args"] = args
    return md


def apply(tenant: Tenant, md: dict[str, Any], *flags: str) -> Any:
    return tenant.kubectl("apply", *flags, "-f", "-", input=yaml.safe_dump(md))


@pytest.mark.parametrize(
    ("override", "read_as", "field"), OVERRIDES, ids=[" ".join(o[0]) for o in OVERRIDES]
)
def test_a_tenant_cannot_override_a_flag_kvgate_sets_through_engine_args(
    world: World, namespace: str, override: list[str], read_as: str, field: str
) -> None:
    tenant = make_tenant(world, namespace)
    tuned = apply(tenant, with_engine_args("llama", TUNING), "--dry-run=server")
    assert tuned.returncode == 0, f"the tenant cannot apply a ModelDeployment: {tuned.stderr}"

    denied = apply(tenant, with_engine_args("llama", [*TUNING, *override]))
    err = str(denied.stderr)
    print(f"DENIED {override}: {err[err.find('denied the request') :].strip()[:700]}")
    assert denied.returncode != 0, f"the API server admitted it:\n{denied.stdout}"
    index = len(TUNING)
    written = override[0] if "=" in override[0] else " ".join(override)
    for phrase in (
        WEBHOOK,
        f"spec.engine.args[{index}]: {written}: SGLang reads it as {read_as}",
        "SGLang keeps the last value",
        f"remove it and set {field}",
    ):
        assert phrase in err, f"{phrase!r} not in: {err[-2000:]}"
    assert world.get_md("llama", namespace) is None
