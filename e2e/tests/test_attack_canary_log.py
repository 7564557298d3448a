"""A tenant writes SGLang's KV-canary record into an engine's log; kvgate is not fooled.

With ``safety.kvCanary`` kvgate follows each verified engine's log and takes the engine out of
traffic at SGLang's canary record. Engines log client-chosen text: an error that quotes what was
sent to the prefill's bootstrap port, and, with ``--log-requests``, every request's id and
prompt (SGLang's request logger). A namespace editor (the built-in ``edit`` role) applies a
ModelDeployment with both, then sends the record, SGLang's log prefix and a newline included,
as bootstrap input, as request ids and as prompts, through the router and to each engine.

What a user sees: the text is in both engines' logs (``kubectl logs``), and both engines stay
verified and Ready, with no ``KvCanaryViolation`` Event. The control: a real corrupt KV slot on
the decode engine still trips its gate, and what kvgate reports is that record's fields
(``fail_reason=verify_position``, ``position=1000003``), not the tenant's.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_canary_log.py -v -s`` (root).
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.world import World, condition, http_json, is_ready
from scenario_helpers import (
    GATE,
    SERVED_MODEL,
    Tenant,
    deadline_loop,
    events,
    known_answer,
    make_tenant,
    sample_md,
    wait_known_answer,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
REASON = "KvCanaryViolation"
BOOTSTRAP_PORT = 8998  # the sample's spec.engine.bootstrapPort (its default)
# SGLang's record, whole and well-formed but for where it stands, with numbers no real
# violation of this engine has: if kvgate ever reports 4242, it read the tenant's text.
FORGED = (
    "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_chain_hash slot_idx=4242 "
    "position=4242 stored_token=0 expected_token=0 stored_chain_hash=0x0000000000000000 "
    "expected_aux=0x0000000000000000"
)
# The record on a line of its own, SGLang's prefix included, if the newline survived.
FORGED_LINE = f"\n[2026-11-05 12:00:00] {FORGED}"
SIGNATURE = "slot_idx=4242"
# A window, not a deadline: after the real violation tripped the decode (the canary scenario
# bounds that way in from its own measured rounds, test_scenario_kv_canary Round.bound; the
# issue's target is 2 s), the forged lines get 15 s more to trip the prefill if kvgate read them
# as SGLang's.
HOLD_SECONDS = 15.0
# Deadlines and request timeouts, not bounds: only a step that never happens or a request that
# hangs reaches one. Shared ones come from kvgate_e2e.deadlines.
CONNECT_TIMEOUT = 10  # one TCP connection to the prefill's bootstrap port through the relay
CLOSE_TIMEOUT = 30  # the engine logging the unreadable line and closing the connection
DIRECT_TIMEOUT = 30  # one forged request straight to an engine (its answer is not the point)
LOG_DEADLINE = 60  # the tenant's text in an engine's log, read through kubectl logs
KNOWN_ANSWER_TIMEOUT = 10  # one known-answer request that makes the decode engine decode
# The decode's gate False after a real corrupt slot: the next decode writes the violation line,
# kvgate reads the log and turns the gate (seconds; the run prints it).
TRIP_DEADLINE = 90


def canary_md(name: str) -> dict[str, Any]:
    md = sample_md(name)
    md["spec"]["safety"]["kvCanary"] = True
    md["spec"]["engine"]["args"] = ["--log-requests", "--log-requests-level", "3"]
    return md


def send_bootstrap_lines(world: World, prefill: dict[str, Any], lines: list[str]) -> None:
    """One TCP connection per line to the prefill's bootstrap port; the engine answers an
    unreadable request by logging the error and closing."""
    port = world.forward(prefill["status"]["podIP"], BOOTSTRAP_PORT)
    for line in lines:
        with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT) as conn:
            conn.sendall(line.encode() + b"\n")
            conn.settimeout(CLOSE_TIMEOUT)
            while conn.recv(4096):  # until the engine closes
                pass


def forged_requests() -> list[dict[str, Any]]:
    """/generate bodies carrying the record as the request id and as the prompt."""
    base = {"model": SERVED_MODEL, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    return [
        {**base, "rid": FORGED_LINE, "text": "hello"},
        {**base, "rid": FORGED, "text": FORGED_LINE},
    ]


def logs(tenant: Tenant, pod: str) -> str:
    """The engine container's log, read as the tenant reads it."""
    proc = tenant.kubectl("logs", pod, "-c", "engine")
    return str(proc.stdout) if proc.returncode == 0 else ""


def gate_of(world: World, ns: str, pod: str) -> dict[str, Any] | None:
    live = world.get("pod", pod, ns)
    return condition(live, GATE) if live else None


def verified_and_ready(world: World, ns: str, pod: str) -> bool:
    live = world.get("pod", pod, ns)
    gate = condition(live, GATE) if live else None
    return live is not None and gate is not None and gate["status"] == "True" and is_ready(live)


def test_a_forged_canary_record_in_client_text_leaves_the_engines_verified(
    world: World, namespace: str
) -> None:
    ns, md = namespace, "forged-canary"
    tenant = make_tenant(world, ns)
    applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(canary_md(md)))
    assert applied.returncode == 0, applied.stderr
    wait_md_ready(world, md, ns, REVISION_DEADLINE, "the canary revision to serve")
    wait_known_answer(world, md, ns, STEP_DEADLINE)
    selector = f"kvgate.io/deployment={md},kvgate.io/component=engine"
    pods = {p["metadata"]["labels"]["kvgate.io/role"]: p for p in world.list("pods", ns, selector)}
    prefill, decode = pods["prefill"], pods["decode"]
    names = {role: p["metadata"]["name"] for role, p in pods.items()}
    for pod in (prefill, decode):
        engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
        argv = " ".join([*(engine.get("command") or []), *(engine.get("args") or [])])
        assert "--kv-canary log" in argv and "--log-requests" in argv, argv

    # The attack: bootstrap input, request ids and prompts, through the router and direct.
    started = time.time()
    send_bootstrap_lines(
        world, prefill, [json.dumps({"room": FORGED_LINE}), json.dumps({"room": FORGED})]
    )
    answers: list[str] = []
    for body in forged_requests():
        code, _ = world.router_request(md, body, ns)
        answers.append(f"router {code}")
        for role, pod in (("prefill", prefill), ("decode", decode)):
            # As SGLang's own health requests do: bootstrap_host 2.2.2.2 means no KV transfer.
            direct = {**body, "bootstrap_host": "2.2.2.2", "bootstrap_room": 7}
            try:
                code, _ = http_json(
                    f"{world.engine_url(pod)}/generate", direct, timeout=DIRECT_TIMEOUT
                )
            except OSError as error:  # what the engine answers is not the point: its log is
                code = str(error)
            answers.append(f"{role} {code}")
    for role, name in names.items():
        deadline_loop(
            f"the tenant's text in the {role} engine's log",
            lambda name=name: SIGNATURE in logs(tenant, name),
            LOG_DEADLINE,
        )
    written = time.time()
    forged_lines = {role: logs(tenant, name).count(SIGNATURE) for role, name in names.items()}

    # The control: a real corrupt KV slot on the decode engine trips its gate, with its record.
    code, answer = http_json(f"{world.engine_url(decode)}/kvgate/canary/corrupt", body={})
    assert code == 200, (code, answer)

    def decode_tripped() -> dict[str, Any] | None:
        known_answer(world, md, ns, timeout=KNOWN_ANSWER_TIMEOUT)  # makes the decode engine decode
        gate = gate_of(world, ns, names["decode"])
        return gate if gate is not None and gate["status"] == "False" else None

    gate = deadline_loop(
        "the decode engine's gate False after a real violation", decode_tripped, TRIP_DEADLINE
    )
    tripped = time.time()
    said = gate["message"]
    assert gate["reason"] == REASON, said
    assert "fail_reason=verify_position" in said and "position=1000003" in said, said
    assert "4242" not in said and "verify_chain_hash" not in said, said

    # The prefill engine, whose log holds the forged record too, stays verified and Ready.
    hold_end = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < hold_end:
        assert verified_and_ready(world, ns, names["prefill"]), world.get(
            "pod", names["prefill"], ns
        )
        time.sleep(0.5)
    found = [
        e
        for e in events(world, ns, REASON)
        if e["involvedObject"].get("kind") == "ModelDeployment"
        and e["involvedObject"].get("name") == md
    ]
    assert len(found) == 1 and names["decode"] in found[0]["message"], found
    assert "4242" not in found[0]["message"], found
    print(
        f"MEASURED forged canary record: {forged_lines['prefill']} lines in the prefill's log, "
        f"{forged_lines['decode']} in the decode's, {written - started:.1f} s to write them; "
        f"the real violation took the decode's gate False {tripped - written:.1f} s after the "
        f"forged lines were in the log; the prefill stayed verified {HOLD_SECONDS:.0f} s more; "
        f"{len(found)} KvCanaryViolation Event (the real one); answers: {', '.join(answers)}"
    )
