"""Input limits: every input a tenant controls is bounded, and what kvgate
cannot build or run from is denied at admission — never admitted to fail later.

Each rule: allowed at the limit, denied one above, and the message names the field, the numbers
and the way out.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from factories.admission_reviews import (
    DELETE,
    SAMPLE,
    LiveWebhook,
    live,
    mutated,
    post,
    review,
    sample,
)
from kvgate.admission import check_document, check_update
from kvgate.admission.limits import MAX_SPEC_BYTES, _spec_schema, spec_bytes, with_defaults
from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.router_args import DENIED_ROUTER_FLAGS, denied_flag
from kvgate.api.models import (
    MAX_ARG_LENGTH,
    MAX_ARGS,
    MAX_ENGINE_REPLICAS,
    MAX_ROUTER_REPLICAS,
    ModelDeployment,
)
from kvgate.api.revision import REVISION_LENGTH
from kvgate.cmd.cli import main
from kvgate.objects import builders, network_policy
from kvgate.objects.names import DNS_1035_LABEL, derived_names, max_name_length
from kvgate.webhook.app import serving

# ---------------------------------------------------------------------------------- names


def _denials(document: dict[str, Any], field: str, policy: ClusterPolicy | None = None) -> str:
    result = check_document(document, policy or ClusterPolicy())
    named = [d.message for d in result.denials if d.field == field]
    assert named, f"no denial on {field}: {result.message or 'allowed'}"
    return named[0]


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("llama-3.1-8b", "llama-3-1-8b"),  # a valid object name, an invalid Service name
        ("8b-llama", None),  # a Service name must start with a letter
        ("Llama-8B", "llama-8b"),
    ],
)
def test_name_that_cannot_name_a_service_is_denied_with_the_rule(
    name: str, suggestion: str | None
) -> None:
    message = _denials(mutated({"metadata.name": name}), "metadata.name")
    assert "DNS-1035" in message
    assert repr(name) in message
    assert "Service" in message
    if suggestion is not None:
        assert f"e.g. {suggestion}" in message


def test_longest_name_is_allowed_and_one_more_character_is_denied_naming_the_service() -> None:
    longest = max_name_length()
    assert longest == 63  # the Service <md> and the kvgate.io/deployment label value
    assert check_document(mutated({"metadata.name": "m" * longest})).allowed
    message = _denials(mutated({"metadata.name": "m" * (longest + 1)}), "metadata.name")
    assert f"{longest + 1} characters > {longest}" in message
    assert "Service" in message and "kvgate.io/deployment" in message
    assert "shorter name" in message


_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _md_named(name: str) -> ModelDeployment:
    doc = mutated({"metadata.name": name, "metadata.namespace": "n", "metadata.uid": "u"})
    return ModelDeployment.model_validate(doc)


def test_every_object_kvgate_builds_for_the_longest_name_is_valid_for_its_kind() -> None:
    """What the API server would refuse when the operator creates it (the silent failure)."""
    md = _md_named("a" * max_name_length())
    revision = "0" * REVISION_LENGTH  # the table uses a fixed-length placeholder revision
    built = [
        builders.service(md, revision),
        builders.router_service_account(md),
        builders.router_role(md),
        builders.router_role_binding(md),
        builders.router_control_secret(md, "key"),
        *(builders.deployment(md, revision, c, replicas=1) for c in builders.COMPONENTS),
        *network_policy.network_policies(
            md,
            revision,
            operator_namespace="kvgate-system",
            operator_pod_labels={"app.kubernetes.io/name": "kvgate"},
            router_egress=network_policy.RouterEgress(),
        ),
    ]
    for body in built:
        name = body["metadata"]["name"]
        if body["kind"] == "Service":
            assert len(name) <= 63 and DNS_1035_LABEL.fullmatch(name), name
        else:
            assert len(name) <= 253 and _DNS_1123_SUBDOMAIN.fullmatch(name), name
        if body["kind"] == "Deployment":
            # The ReplicaSet is <deployment>-<pod-template-hash> (a uint32, up to 10 chars).
            assert len(f"{name}-{'9' * 10}") <= 253
            pod_labels = body["spec"]["template"]["metadata"]["labels"]
        else:
            pod_labels = {}
        for key, value in {**body["metadata"]["labels"], **pod_labels}.items():
            assert len(value) <= 63 and _LABEL_VALUE.fullmatch(value), (key, value)
    # The table admission computes the limit from covers every name built above.
    table = {d.name for d in derived_names(md.metadata.name or "")}
    assert {b["metadata"]["name"] for b in built} <= table


def test_derived_name_table_names_each_object_and_its_limit() -> None:
    names = {d.what: d for d in derived_names("llama")}
    assert names["Service"].name == "llama" and names["Service"].max_length == 63
    assert names["kvgate.io/deployment label value"].max_length == 63
    assert names["router ServiceAccount, Role and RoleBinding"].name == "llama-router"
    assert names["prefill Deployment"].name == builders.component_name(
        "llama", "0" * REVISION_LENGTH, "prefill"
    )


def test_update_that_keeps_an_old_invalid_name_is_not_blocked() -> None:
    """Objects admitted before this rule stay deletable (a finalizer removal is an UPDATE)."""
    old = mutated({"metadata.name": "llama-3.1-8b"})
    new = mutated({"metadata.finalizers": []}, base=old)
    result = check_update(new, old)
    assert result.allowed
    assert any("DNS-1035" in w.message for w in result.warnings)


# ----------------------------------------------------------------------------- object size


def _padded(total_spec_bytes: int) -> dict[str, Any]:
    """The sample with a config padded so that the spec is exactly `total_spec_bytes`."""
    doc = mutated({"spec.model.config.padding": ""})
    missing = total_spec_bytes - spec_bytes(doc["spec"])
    assert missing >= 0
    doc["spec"]["model"]["config"]["padding"] = "x" * missing
    assert spec_bytes(doc["spec"]) == total_spec_bytes
    return doc


def test_spec_at_the_size_limit_is_allowed_and_one_byte_more_is_denied() -> None:
    assert check_document(_padded(MAX_SPEC_BYTES)).allowed
    message = _denials(_padded(MAX_SPEC_BYTES + 1), "spec")
    assert f"{MAX_SPEC_BYTES + 1:,} bytes" in message
    assert f"{MAX_SPEC_BYTES:,}" in message
    assert "spec.model.config" in message  # the part that makes it big
    assert "remove" in message  # the way out


def test_six_hundred_kib_object_is_denied_with_one_clear_message() -> None:
    doc = mutated({"spec.model.config.padding": "x" * (600 * 1024)})
    result = check_document(doc)
    assert not result.allowed
    assert [d.field for d in result.denials] == ["spec"]
    assert "spec.model.config" in result.message and "KiB" in result.message


def test_a_real_model_config_fits_far_below_the_limit() -> None:
    # A DeepSeek-V3-sized config.json (~60 keys, nested quantization and rope settings) with a
    # 500-entry quantization ignore list, as FP8 and FP4 checkpoints ship: still under a third.
    config: dict[str, Any] = {f"key_{i}": i * 1.5 for i in range(60)}
    config["rope_scaling"] = {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
    }
    config["quantization_config"] = {
        "quant_method": "fp8",
        "ignore": [
            f"model.layers.{i}.mlp.experts.{j}.gate_proj" for i in range(50) for j in range(10)
        ],
    }
    doc = mutated({"spec.model.config": {**sample()["spec"]["model"]["config"], **config}})
    assert spec_bytes(doc["spec"]) < MAX_SPEC_BYTES / 3
    assert check_document(doc).allowed


# ----------------------------------------------------------------------- numbers and lists

# (case, field path, limit, value one above, words of the way out)
BOUNDS: list[tuple[str, str, int, str]] = [
    ("engine replicas", "spec.prefill.replicas", MAX_ENGINE_REPLICAS, "at most"),
    ("decode replicas", "spec.decode.replicas", MAX_ENGINE_REPLICAS, "at most"),
    ("router replicas", "spec.router.replicas", MAX_ROUTER_REPLICAS, "at most"),
    ("verify timeout", "spec.rollout.verifyTimeoutSeconds", 86_400, "at most"),
    ("re-verify interval", "spec.rollout.reverifyIntervalSeconds", 3_600, "at most"),
]


@pytest.mark.parametrize(
    ("field", "limit", "way"), [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS]
)
def test_number_at_its_limit_is_allowed_and_one_above_is_denied(
    field: str, limit: int, way: str
) -> None:
    assert check_document(mutated({field: limit})).allowed
    message = _denials(mutated({field: limit + 1}), field)
    assert f"<= {limit:,}" in message and f"got {limit + 1:,}" in message
    assert way in message


LISTS: list[tuple[str, str, int, Any]] = [
    ("router args", "spec.router.args", MAX_ARGS, "--log-json"),
    ("engine args", "spec.engine.args", MAX_ARGS, "--enable-metrics"),
    ("engine env", "spec.engine.env", MAX_ARGS, {"name": "A", "value": "1"}),
    ("tolerations", "spec.decode.tolerations", 32, {"key": "k", "operator": "Exists"}),
]


@pytest.mark.parametrize(
    ("field", "limit", "item"), [c[1:] for c in LISTS], ids=[c[0] for c in LISTS]
)
def test_list_at_its_limit_is_allowed_and_one_more_item_is_denied(
    field: str, limit: int, item: Any
) -> None:
    assert check_document(mutated({field: [item] * limit})).allowed
    message = _denials(mutated({field: [item] * (limit + 1)}), field)
    assert f"at most {limit:,} items (got {limit + 1:,})" in message
    assert "remove" in message


def test_string_at_its_limit_is_allowed_and_one_more_character_is_denied() -> None:
    at_limit = "--model-alias=" + "a" * (MAX_ARG_LENGTH - len("--model-alias=") - 2) + "=b"
    assert len(at_limit) == MAX_ARG_LENGTH
    assert check_document(mutated({"spec.router.args": [at_limit]})).allowed
    message = _denials(mutated({"spec.router.args": [at_limit + "b"]}), "spec.router.args[0]")
    assert f"at most {MAX_ARG_LENGTH:,} characters (got {MAX_ARG_LENGTH + 1:,})" in message
    assert "shorten" in message


def test_node_selector_with_too_many_labels_is_denied() -> None:
    at_limit = {f"k{i}": "v" for i in range(32)}
    assert check_document(mutated({"spec.prefill.nodeSelector": at_limit})).allowed
    over = {**at_limit, "one-more": "v"}
    message = _denials(mutated({"spec.prefill.nodeSelector": over}), "spec.prefill.nodeSelector")
    assert "at most 32 items (got 33)" in message


# ------------------------------------------------------------------------------ router.args

DENIED_ARGS: list[tuple[list[str], str]] = [
    (["--worker-urls", "http://x"], "--worker-urls"),
    (["--worker-urls=http://x"], "--worker-urls"),
    (["--worker-u", "http://x"], "--worker-urls"),  # argparse accepts unique prefixes
    (["--worker-u=http://x"], "--worker-urls"),
    (["--prefill", "http://x", "8998"], "--prefill"),
    (["--decode=http://x"], "--decode"),
    (["--service-discovery-namespace", "other"], "--service-discovery-namespace"),
    (["--service-discovery-port=1"], "--service-discovery-port"),
    (["--prefill-selector", "app=evil"], "--prefill-selector"),
    (["--decode-sel", "app=evil"], "--decode-selector"),
    (["--selector", "app=evil"], "--selector"),
    (["--router-selector", "a=b"], "--router-selector"),
    (["--discovery-file", "/tmp/workers.json"], "--discovery-file"),
    (["--enable-mesh", "--mesh-peer-urls", "evil:39527"], "--enable-mesh"),
    (["--enable-igw"], "--enable-igw"),
    (["--enable-rl"], "--enable-rl"),
    (["--control-plane-api-keys", "k:n:admin:s"], "--control-plane-api-keys"),
    (["--api-key", "s"], "--api-key"),
    (["--tenant-api-key", "t:s"], "--tenant-api-key"),
    (["--jwt-issuer", "https://evil"], "--jwt-issuer"),
    (["--host", "127.0.0.1"], "--host"),
    (["--port=1"], "--port"),
    (["--tls-cert-path", "/c"], "--tls-cert-path"),
    (["--ca-cert-paths", "/c"], "--ca-cert-paths"),
    (["--policy", "random", "--worker-urls", "http://x"], "--worker-urls"),
]


@pytest.mark.parametrize(("args", "flag"), DENIED_ARGS, ids=[" ".join(a) for a, _ in DENIED_ARGS])
def test_router_args_that_add_workers_or_change_auth_are_denied(args: list[str], flag: str) -> None:
    result = check_document(mutated({"spec.router.args": args}))
    assert not result.allowed
    arg_denials = [d for d in result.denials if d.field.startswith("spec.router.args[")]
    assert arg_denials, result.message
    message = arg_denials[0].message
    assert flag in message
    assert "remove" in message


ALLOWED_ARGS = [
    ["--policy", "round_robin"],
    ["--prefill-policy=cache_aware", "--decode-policy", "power_of_two"],
    ["--log-level", "debug", "--log-json"],
    ["--model-alias", "llama=llama-3.1-8b"],
    ["--control-plane-audit-enabled"],
    ["--request-timeout-secs", "600", "--max-concurrent-requests", "64"],
    ["--prefill-queue-size", "16"],
]


@pytest.mark.parametrize("args", ALLOWED_ARGS, ids=[" ".join(a) for a in ALLOWED_ARGS])
def test_router_args_that_tune_routing_are_allowed(args: list[str]) -> None:
    result = check_document(mutated({"spec.router.args": args}))
    assert result.allowed, result.message


def _smg_parser() -> argparse.ArgumentParser:
    router_args = pytest.importorskip("smg.router_args")
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def _smg_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for s in parser._option_string_actions if s.startswith("--")}


def test_every_denied_flag_is_a_flag_of_the_smg_we_ship_with_all_its_aliases() -> None:
    parser = _smg_parser()
    assert set(DENIED_ROUTER_FLAGS) <= _smg_flags(parser)
    for action in parser._actions:
        if set(action.option_strings) & set(DENIED_ROUTER_FLAGS):
            assert set(action.option_strings) <= set(DENIED_ROUTER_FLAGS), action.option_strings


def test_every_spelling_smg_reads_as_a_denied_flag_is_denied_and_no_other_flag_is() -> None:
    """Ask smg's own parser (argparse, allow_abbrev=True) what each spelling means."""
    parser = _smg_parser()
    assert parser.allow_abbrev and parser.fromfile_prefix_chars is None
    flags = _smg_flags(parser)
    checked = 0
    for flag in flags:
        for end in range(3, len(flag) + 1):
            for arg in (flag[:end], f"{flag[:end]}=v"):
                try:
                    parsed = parser._parse_optional(arg)
                except SystemExit:  # ambiguous: smg would not start; denied or not is moot
                    continue
                if not parsed:
                    continue
                tuples = parsed if isinstance(parsed, list) else [parsed]
                actions = [t[0] for t in tuples if t[0] is not None]
                if any(set(a.option_strings) & set(DENIED_ROUTER_FLAGS) for a in actions):
                    assert denied_flag(arg) is not None, f"smg reads {arg} as a denied flag"
                    checked += 1
    assert checked > 100
    for flag in flags - set(DENIED_ROUTER_FLAGS):
        assert denied_flag(flag) is None, f"{flag} is allowed by smg's parser but denied here"
        assert denied_flag(f"{flag}=1") is None, flag


# ---------------------------------------------------------------------- engine version floor

FLOOR = ClusterPolicy(min_engine_version_floor="0.5.23")


def test_min_engine_version_below_the_cluster_floor_is_denied_naming_the_floor() -> None:
    doc = mutated({"spec.safety.minEngineVersion": "0.5.22"})
    message = _denials(doc, "spec.safety.minEngineVersion", FLOOR)
    assert "0.5.22 < the cluster's engine version floor 0.5.23" in message
    assert "engineVersionFloor" in message  # where the floor comes from
    assert "an omitted minEngineVersion is 0.5.22, also below it" in message
    assert "set spec.safety.minEngineVersion to 0.5.23 or later" in message
    at_default_floor = ClusterPolicy(min_engine_version_floor="0.5.22")
    doc = mutated({"spec.safety.minEngineVersion": "0.5.21"})
    message = _denials(doc, "spec.safety.minEngineVersion", at_default_floor)
    assert "0.5.21 < the cluster's engine version floor 0.5.22" in message
    assert "omitted" not in message


def test_min_engine_version_at_the_cluster_floor_is_allowed() -> None:
    doc = mutated({"spec.safety.minEngineVersion": "0.5.23"})
    assert check_document(doc, FLOOR).allowed


def test_image_below_the_cluster_floor_is_denied_naming_the_floor() -> None:
    doc = mutated(
        {"spec.safety.minEngineVersion": "0.5.23", "spec.engine.image": "lmsysorg/sglang:v0.5.22"}
    )
    message = _denials(doc, "spec.engine.image", FLOOR)
    assert "0.5.22" in message and "0.5.23" in message


def test_without_a_cluster_floor_the_spec_floor_alone_applies() -> None:
    assert check_document(sample(), ClusterPolicy()).allowed
    assert check_document(sample()).allowed


@pytest.mark.parametrize("floor", ["soon", "", "0.5.22; rm -rf /"])
def test_unreadable_cluster_floor_is_refused_when_configured(floor: str) -> None:
    with pytest.raises(ValueError, match="not a version"):
        ClusterPolicy(min_engine_version_floor=floor)


def test_update_lowering_the_spec_floor_below_the_cluster_floor_is_denied() -> None:
    old = mutated({"spec.safety.minEngineVersion": "0.5.23"})
    new = mutated({"spec.safety.minEngineVersion": "0.5.22"})
    assert not check_update(new, old, FLOOR).allowed


def test_size_is_measured_after_the_api_servers_defaults_so_validate_and_webhook_agree() -> None:
    """The webhook sees the spec with the CRD's defaults filled in (and 1.0 written as 1);
    `kvgate validate` reads the file without them. Both must measure the same bytes."""
    raw = mutated({"spec.rollout": DELETE, "spec.router": DELETE, "spec.safety.headroom": 1.0})
    stored = json.loads(json.dumps(with_defaults(raw["spec"], _spec_schema())))
    assert "rollout" in stored and stored["router"]["image"]  # filled in, as the server does
    stored["safety"]["headroom"] = 1  # Go writes the floats 1.0 and 15.0 as 1 and 15
    stored["model"]["weightsGiB"] = 15
    stored["rollout"]["stepCheck"]["maxErrorPercent"] = 1  # 1.0 and 100.0, as Go writes them
    stored["rollout"]["stepCheck"]["maxRejectedPercent"] = 100
    assert spec_bytes(raw["spec"]) == spec_bytes(stored)
    compact = json.dumps(stored, separators=(",", ":"))
    assert spec_bytes(stored) == len(compact)
    stored["model"]["name"] = "é"
    assert spec_bytes(stored) == len(compact) - len("llama-3.1-8b") + len("\\u00e9")


# ------------------------------------------- the same answers from the webhook and validate


@pytest.fixture
async def floored_webhook(tls_dir: Path) -> AsyncIterator[LiveWebhook]:
    """The webhook as the operator serves it with the chart's engineVersionFloor 0.5.23."""
    async with serving(tls_dir, policy=FLOOR) as server:
        yield live(server.url, tls_dir)


INPUT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("at the limits", {"metadata.name": "m" * 63, "spec.safety.minEngineVersion": "0.5.23"}),
    ("service name", {"metadata.name": "llama-3.1-8b"}),
    ("name too long", {"metadata.name": "m" * 64}),
    ("worker urls", {"spec.router.args": ["--worker-urls", "http://x"]}),
    ("below the floor", {"spec.safety.minEngineVersion": "0.5.22"}),
    ("too large", {"spec.model.config.padding": "x" * MAX_SPEC_BYTES}),
    ("too many replicas", {"spec.decode.replicas": MAX_ENGINE_REPLICAS + 1}),
]


@pytest.mark.parametrize("changes", [c[1] for c in INPUT_CASES], ids=[c[0] for c in INPUT_CASES])
async def test_webhook_and_validate_give_the_same_answer_under_the_cluster_floor(
    floored_webhook: LiveWebhook,
    changes: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = mutated({"spec.safety.minEngineVersion": "0.5.23", **changes})
    _, answer = await post(floored_webhook, review(doc))
    allowed = answer["response"]["allowed"]
    assert allowed == (changes == INPUT_CASES[0][1])

    path = tmp_path / "md.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    code = main(["validate", str(path), "--min-version-floor", "0.5.23", "--json"])
    offline = json.loads(capsys.readouterr().out)
    assert code == (0 if allowed else 1)
    if not allowed:
        message = answer["response"]["status"]["message"]
        for denial in offline["documents"][0]["denials"]:
            assert f"{denial['field']}: {denial['message']}" in message


async def test_webhook_without_a_policy_in_the_memo_applies_each_spec_floor_only(
    live_webhook: LiveWebhook,
) -> None:
    doc = mutated({"spec.safety.minEngineVersion": "0.5.22"})
    _, answer = await post(live_webhook, review(doc))
    assert answer["response"]["allowed"] is True


def test_validate_refuses_an_unreadable_floor_with_exit_two(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["validate", str(SAMPLE), "--min-version-floor", "soon"]) == 2
    assert "--min-version-floor: 'soon' is not a version" in capsys.readouterr().err


def test_operator_refuses_to_start_with_an_unreadable_floor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVGATE_MIN_ENGINE_VERSION_FLOOR", "soon")
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")  # no operator pod identity here
    assert main(["operator", "--no-webhook"]) == 2
    err = capsys.readouterr().err
    assert "KVGATE_MIN_ENGINE_VERSION_FLOOR (the chart value engineVersionFloor)" in err
    assert "'soon' is not a version" in err
