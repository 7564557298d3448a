"""Pure behaviour of the loopback kubelet: readiness math, image mapping, node syntax, phases.

No cluster needed; these run in well under a second.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e.kubelet.agent import KubeletConfig, KubeletThread, LoopbackKubelet, container_pid
from kvgate_e2e.kubelet.images import (
    ImageError,
    expand_vars,
    launch_for,
    parse_image,
    rewrite_host,
)
from kvgate_e2e.kubelet.mounts import PROJECT_ROOT, keep_visible, order_mounts
from kvgate_e2e.kubelet.node import (
    GPU_MEMORY_KEY,
    MAX_TOTAL_TOKENS_ANNOTATION,
    NodeSpecError,
    gpu_memory_from_node,
    node_manifest,
    node_status,
    parse_node_spec,
)
from kvgate_e2e.kubelet.podspec import PodSpecError, field_ref_value, probe_settings, resolve_port
from kvgate_e2e.kubelet.readiness import (
    Condition,
    containers_ready_condition,
    initialized_condition,
    kubelet_conditions_differ,
    merge_conditions,
    pod_ready_condition,
)
from kvgate_e2e.kubelet.status import (
    RUNNING,
    TERMINATED,
    ContainerRecord,
    container_status,
    exit_code_of,
    pod_phase,
    restart_delay,
    should_restart,
)

GATE = "kvgate.io/engine-verified"
# A kubelet thread whose start fails at once (no such directory); ends a start that hung.
FAILING_START_TIMEOUT = 10


def spec(
    *names: str, gates: tuple[str, ...] = (), init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"containers": [{"name": n} for n in names]}
    if gates:
        out["readinessGates"] = [{"conditionType": g} for g in gates]
    if init:
        out["initContainers"] = init
    return out


def statuses(**ready: bool) -> list[dict[str, Any]]:
    return [{"name": n, "ready": r} for n, r in ready.items()]


# ---------------------------------------------------------------- readiness (generate.go)
def test_all_containers_ready_and_no_gates_makes_pod_ready() -> None:
    cond = pod_ready_condition(spec("engine"), [], statuses(engine=True), "Running")
    assert cond == Condition("Ready", "True")


def test_unready_containers_are_listed_like_go_slices() -> None:
    cond = containers_ready_condition(
        spec("engine", "sidecar", "metrics"),
        statuses(engine=False, sidecar=False, metrics=True),
        "Running",
    )
    assert cond == Condition(
        "ContainersReady",
        "False",
        "ContainersNotReady",
        "containers with unready status: [engine sidecar]",
    )


def test_unknown_and_unready_containers_are_both_reported() -> None:
    cond = containers_ready_condition(spec("a", "b"), statuses(b=False), "Pending")
    assert cond.message == (
        "containers with unknown status: [a], containers with unready status: [b]"
    )


def test_no_container_statuses_at_all_is_unknown_container_statuses() -> None:
    cond = pod_ready_condition(spec("engine"), [], None, "Pending")
    assert (cond.status, cond.reason, cond.message) == ("False", "UnknownContainerStatuses", "")


def test_ready_copies_containers_ready_when_containers_are_not_ready() -> None:
    cond = pod_ready_condition(
        spec("engine", gates=(GATE,)),
        [{"type": GATE, "status": "True"}],
        statuses(engine=False),
        "Running",
    )
    assert cond == Condition(
        "Ready", "False", "ContainersNotReady", "containers with unready status: [engine]"
    )


def test_missing_gate_condition_keeps_pod_unready_even_with_ready_containers() -> None:
    cond = pod_ready_condition(spec("engine", gates=(GATE,)), [], statuses(engine=True), "Running")
    assert cond == Condition(
        "Ready",
        "False",
        "ReadinessGatesNotReady",
        f'corresponding condition of pod readiness gate "{GATE}" does not exist.',
    )


def test_false_gate_condition_keeps_pod_unready() -> None:
    cond = pod_ready_condition(
        spec("engine", gates=(GATE,)),
        [{"type": GATE, "status": "False", "reason": "KvPoolTooSmall"}],
        statuses(engine=True),
        "Running",
    )
    assert cond.reason == "ReadinessGatesNotReady"
    assert cond.message == f'the status of pod readiness gate "{GATE}" is not "True", but False'


def test_every_unmet_gate_is_reported_joined_by_comma() -> None:
    cond = pod_ready_condition(
        spec("engine", gates=("a.io/x", "b.io/y", "c.io/z")),
        [{"type": "b.io/y", "status": "Unknown"}, {"type": "c.io/z", "status": "True"}],
        statuses(engine=True),
        "Running",
    )
    assert cond.message == (
        'corresponding condition of pod readiness gate "a.io/x" does not exist., '
        'the status of pod readiness gate "b.io/y" is not "True", but Unknown'
    )


def test_true_gate_and_ready_containers_make_pod_ready() -> None:
    cond = pod_ready_condition(
        spec("engine", gates=(GATE,)),
        [{"type": GATE, "status": "True"}],
        statuses(engine=True),
        "Running",
    )
    assert cond.status == "True"


def test_terminal_phases_are_pod_completed_and_pod_failed() -> None:
    done = containers_ready_condition(spec("job"), statuses(job=False), "Succeeded")
    failed = containers_ready_condition(spec("job"), statuses(job=False), "Failed")
    assert (done.reason, failed.reason) == ("PodCompleted", "PodFailed")


def test_restartable_init_containers_count_for_containers_ready() -> None:
    pod_spec = spec(
        "engine", init=[{"name": "proxy", "restartPolicy": "Always"}, {"name": "setup"}]
    )
    cond = containers_ready_condition(pod_spec, statuses(engine=True, proxy=False), "Running")
    assert cond.message == "containers with unready status: [proxy]"


def test_init_containers_not_finished_keep_pod_uninitialized() -> None:
    init = [{"name": "setup"}]
    running = initialized_condition(
        spec("e", init=init), [{"name": "setup", "state": {"running": {}}}], "Pending"
    )
    # The kubelet marks an init container that exited 0 ready; 1.37 reads that flag.
    done = initialized_condition(
        spec("e", init=init),
        [{"name": "setup", "ready": True, "state": {"terminated": {"exitCode": 0}}}],
        "Running",
    )
    assert running == Condition(
        "Initialized",
        "False",
        "ContainersNotInitialized",
        "containers with incomplete status: [setup]",
    )
    assert done.status == "True"


def test_transition_time_moves_only_when_status_flips() -> None:
    current = [
        {
            "type": "Ready",
            "status": "False",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "reason": "X",
        },
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
    ]
    desired = [Condition("Ready", "True"), Condition("ContainersReady", "True")]
    merged = merge_conditions(current, desired, "2026-01-02T00:00:00Z")
    by_type = {c["type"]: c for c in merged}
    assert by_type["Ready"]["lastTransitionTime"] == "2026-01-02T00:00:00Z"
    assert by_type["ContainersReady"]["lastTransitionTime"] == "2026-01-01T00:00:01Z"
    assert "reason" not in by_type["Ready"]


def test_changed_message_without_flip_is_still_written_but_keeps_transition_time() -> None:
    current = [
        {
            "type": "Ready",
            "status": "False",
            "reason": "ContainersNotReady",
            "message": "containers with unready status: [engine]",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]
    desired = [Condition("Ready", "False", "ReadinessGatesNotReady", "gate")]
    merged = merge_conditions(current, desired, "2026-01-02T00:00:00Z")
    assert merged[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert kubelet_conditions_differ(current, merged)
    assert not kubelet_conditions_differ(merged, merged)


def test_merged_conditions_never_include_a_gate_condition() -> None:
    current = [{"type": GATE, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    merged = merge_conditions(current, [Condition("Ready", "True")], "2026-01-02T00:00:00Z")
    assert [c["type"] for c in merged] == ["Ready"]


# ---------------------------------------------------------------- images → programs
def test_engine_image_runs_the_reference_engine_with_the_same_flags_on_the_pod_ip() -> None:
    launch = launch_for(
        "lmsysorg/sglang:v0.5.23",
        ["python3", "-m", "sglang.launch_server"],
        ["--model-path", "/models/glm", "--host", "0.0.0.0", "--port", "30000"],
        pod_ip="198.18.1.7",
        python="/venv/bin/python",
        venv_bin="/venv/bin",
        gpu_memory_gib=24.0,
    )
    assert launch.argv == (
        "/venv/bin/python",
        "-m",
        "kvgate_engine.reference",
        "--model-path",
        "/models/glm",
        "--host",
        "198.18.1.7",
        "--port",
        "30000",
    )
    assert launch.env == {
        "KVGATE_GPU_MEMORY_GIB": "24",
        "KVGATE_ENGINE_VERSION": "0.5.23",
        "KVGATE_REFERENCE_LOAD_SECONDS": "4.0",  # loads its weights before it listens
    }


def test_engine_without_host_flag_gets_the_pod_ip_and_latest_tag_sets_no_version() -> None:
    launch = launch_for(
        "docker.io/lmsysorg/sglang:latest",
        [],
        ["--model-path", "m", "--host=127.0.0.1"],
        pod_ip="198.18.1.8",
        python="py",
        venv_bin="/v",
        gpu_memory_gib=40.5,
    )
    assert launch.argv[3:] == ("--model-path", "m", "--host=198.18.1.8")
    assert launch.env == {"KVGATE_GPU_MEMORY_GIB": "40.5", "KVGATE_REFERENCE_LOAD_SECONDS": "4.0"}


def test_a_node_annotation_appends_flags_to_every_engine_it_starts_and_to_nothing_else() -> None:
    node = {"e2e.kvgate.io/engine-args": '["--context-length", "131072"]'}
    launch = functools.partial(
        launch_for, pod_ip="198.18.1.7", python="py", venv_bin="/v", gpu_memory_gib=80.0
    )
    engine = launch(
        "lmsysorg/sglang:v0.5.23",
        [],
        ["--context-length", "2048", "--port", "30000"],
        node_annotations=node,
    )
    assert engine.argv[3:] == (
        *("--context-length", "2048", "--port", "30000", "--host", "198.18.1.7"),
        *("--context-length", "131072"),
    )
    router = launch(
        "ghcr.io/lightseekorg/smg:1.13.0",
        ["smg", "launch"],
        ["--port", "8000"],
        node_annotations=node,
    )
    assert "131072" not in router.argv
    with pytest.raises(ImageError, match="JSON list of strings"):
        launch(
            "lmsysorg/sglang:v0.5.23",
            [],
            [],
            node_annotations={"e2e.kvgate.io/engine-args": "--context-length 131072"},
        )


def test_a_node_pool_cap_gives_every_reference_engine_it_starts_a_pool_of_at_most_n() -> None:
    """A node with less free GPU memory, for the reference engine as for the real SGLang: its
    ``--max-total-tokens`` comes after kvgate's flags and the node's engine-args (SGLang and the
    reference engine keep the last value), where admission cannot see it."""
    launch = functools.partial(
        launch_for, pod_ip="198.18.1.7", python="py", venv_bin="/v", gpu_memory_gib=24.0
    )
    node = {
        MAX_TOTAL_TOKENS_ANNOTATION: "692",
        "e2e.kvgate.io/engine-args": '["--max-total-tokens", "100000"]',
    }
    engine = launch(
        "lmsysorg/sglang:latest",
        ["python3", "-m", "sglang.launch_server"],
        ["--max-total-tokens", "8192", "--port", "30000"],
        node_annotations=node,
    )
    assert engine.argv[:3] == ("py", "-m", "kvgate_engine.reference")
    assert engine.argv[-4:] == ("--max-total-tokens", "100000", "--max-total-tokens", "692")
    router = launch("ghcr.io/lightseekorg/smg:1.13.0", ["smg", "launch"], [], node_annotations=node)
    assert "692" not in router.argv
    with pytest.raises(ImageError, match=MAX_TOTAL_TOKENS_ANNOTATION):
        launch(
            "lmsysorg/sglang:v0.5.23",
            [],
            [],
            node_annotations={MAX_TOTAL_TOKENS_ANNOTATION: "0"},
        )


def test_engine_run_by_another_python_module_is_refused_with_the_way_out() -> None:
    with pytest.raises(ImageError, match=r"sglang\.launch_server"):
        launch_for(
            "lmsysorg/sglang:v0.5.23",
            ["python3", "-m", "vllm.entrypoints"],
            [],
            pod_ip="1.2.3.4",
            python="py",
            venv_bin="/v",
            gpu_memory_gib=80,
        )


def test_smg_image_runs_the_smg_console_script_on_the_pod_ip() -> None:
    launch = launch_for(
        "ghcr.io/lightseekorg/smg:1.13.0",
        ["smg", "launch"],
        ["--pd-disaggregation", "--host", "0.0.0.0", "--port", "8000"],
        pod_ip="198.18.1.9",
        python="py",
        venv_bin="/venv/bin",
        gpu_memory_gib=None,
    )
    assert launch.argv == (
        "/venv/bin/smg",
        "launch",
        "--pd-disaggregation",
        "--host",
        "198.18.1.9",
        "--port",
        "8000",
        "--prometheus-host",
        "198.18.1.9",
    )


def test_operator_image_runs_the_kvgate_cli() -> None:
    launch = launch_for(
        "registry.local:5000/acme/kvgate:0.1.0",
        [],
        ["operator", "--namespace", "x"],
        pod_ip="1.2.3.4",
        python="py",
        venv_bin="/venv/bin",
        gpu_memory_gib=80,
    )
    assert launch.argv == ("/venv/bin/kvgate", "operator", "--namespace", "x")


def test_chart_operator_image_with_args_only_runs_its_entrypoint_kvgate_operator() -> None:
    launch = launch_for(
        "ghcr.io/kvgate/kvgate-operator:0.1.0",
        [],
        ["--metrics-port=8080", "--standalone"],
        pod_ip="1.2.3.4",
        python="py",
        venv_bin="/venv/bin",
        gpu_memory_gib=None,
    )
    assert launch.argv == ("/venv/bin/kvgate", "operator", "--metrics-port=8080", "--standalone")


def test_unknown_image_runs_its_command_and_without_command_is_refused() -> None:
    launch = launch_for(
        "busybox:1.36",
        ["python3", "-c", "print(1)"],
        [],
        pod_ip="1",
        python="p",
        venv_bin="/v",
        gpu_memory_gib=1,
    )
    assert launch.argv == ("python3", "-c", "print(1)")
    with pytest.raises(ImageError, match="set `command`"):
        launch_for("busybox:1.36", [], [], pod_ip="1", python="p", venv_bin="/v", gpu_memory_gib=1)


def test_registry_port_is_not_mistaken_for_a_tag() -> None:
    ref = parse_image("localhost:5000/kvgate")
    assert (ref.repository, ref.tag) == ("localhost:5000/kvgate", None)


def test_kubernetes_variable_expansion() -> None:
    env = {"POD_IP": "198.18.1.2", "PORT": "30000"}
    assert expand_vars("--host=$(POD_IP):$(PORT)", env) == "--host=198.18.1.2:30000"
    assert expand_vars("$(MISSING) $$(POD_IP)", env) == "$(MISSING) $(POD_IP)"


def test_rewrite_host_replaces_every_form() -> None:
    assert rewrite_host(["--host", "0.0.0.0", "--port", "1"], "9.9.9.9") == [
        "--host",
        "9.9.9.9",
        "--port",
        "1",
    ]


# ---------------------------------------------------------------- nodes
def test_node_spec_syntax_with_defaults() -> None:
    node = parse_node_spec("small:gpus=8:gpu-memory-gib=24")
    assert (node.name, node.pool, node.gpus, node.gpu_memory_gib) == ("small", "small", 8, 24.0)
    pooled = parse_node_spec("big-1:pool=big:gpus=4")
    assert (pooled.pool, pooled.gpus, pooled.gpu_memory_gib) == ("big", 4, 80.0)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("Big", "lowercase"),
        ("big:gpus", "not key=value"),
        ("big:gpu=8", "unknown key(s) gpu"),
        ("big:gpu-memory-gib=lots", "must be a number"),
        ("big:gpus=eight", "must be an integer"),
    ],
)
def test_bad_node_specs_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(NodeSpecError, match=re.escape(needle)):
        parse_node_spec(text)


def test_node_advertises_gpus_pool_and_gpu_memory() -> None:
    node = parse_node_spec("small:gpus=8:gpu-memory-gib=24")
    manifest = node_manifest(node)
    labels = manifest["metadata"]["labels"]
    assert labels["kvgate.io/pool"] == "small"
    assert labels["kubernetes.io/hostname"] == "small"
    assert manifest["metadata"]["annotations"][GPU_MEMORY_KEY] == "24"
    status = node_status(node, "198.18.0.10", "t0", "t1")
    assert status["allocatable"]["nvidia.com/gpu"] == "8"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    assert {"type": "InternalIP", "address": "198.18.0.10"} in status["addresses"]


def test_gpu_memory_follows_the_node_annotation() -> None:
    node = {"metadata": {"annotations": {GPU_MEMORY_KEY: "16"}, "labels": {GPU_MEMORY_KEY: "24"}}}
    assert gpu_memory_from_node(node, 80.0) == 16.0
    assert gpu_memory_from_node({"metadata": {}}, 80.0) == 80.0


# ---------------------------------------------------------------- pod spec reading
def test_downward_api_field_refs() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}},
        "spec": {"nodeName": "big"},
        "status": {"podIP": "198.18.1.3", "podIPs": [{"ip": "198.18.1.3"}]},
    }
    assert field_ref_value(pod, "metadata.name") == "p"
    assert field_ref_value(pod, "metadata.namespace") == "ns"
    assert field_ref_value(pod, "status.podIP") == "198.18.1.3"
    assert field_ref_value(pod, "metadata.labels['app']") == "x"
    with pytest.raises(PodSpecError, match=r"spec\.bogus"):
        field_ref_value(pod, "spec.bogus")


def test_probe_defaults_and_named_ports() -> None:
    probe = probe_settings({"httpGet": {"path": "/health", "port": "http"}})
    assert (probe.period, probe.timeout, probe.success_threshold, probe.failure_threshold) == (
        10.0,
        1.0,
        1,
        3,
    )
    container = {"name": "engine", "ports": [{"name": "http", "containerPort": 30000}]}
    assert resolve_port("http", container) == 30000
    assert resolve_port(8080, container) == 8080
    with pytest.raises(PodSpecError, match="no port named 'grpc'"):
        resolve_port("grpc", container)


# ---------------------------------------------------------------- statuses, phase, back-off
def test_first_restart_is_immediate_then_back_off_doubles_to_the_cap() -> None:
    delays = [restart_delay(n) for n in range(1, 9)]
    assert delays == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert [restart_delay(n, initial=0.5, maximum=2.0) for n in (2, 3, 4)] == [0.5, 1.0, 2.0]


def test_restart_policy() -> None:
    assert should_restart("Always", 0)
    assert should_restart("OnFailure", 1) and not should_restart("OnFailure", 0)
    assert not should_restart("Never", 137)


def test_killed_process_reports_128_plus_signal() -> None:
    assert exit_code_of(-9) == (137, 9)
    assert exit_code_of(3) == (3, None)


def test_phase_rules() -> None:
    running = ContainerRecord("a", "img", state=RUNNING)
    done_ok = ContainerRecord("b", "img", state=TERMINATED, exit_code=0)
    done_bad = ContainerRecord("c", "img", state=TERMINATED, exit_code=1)
    waiting = ContainerRecord("d", "img")
    assert pod_phase("Always", [running, waiting]) == "Pending"
    assert pod_phase("Always", [running, done_ok]) == "Running"
    assert pod_phase("Never", [done_ok]) == "Succeeded"
    assert pod_phase("Never", [done_ok, done_bad]) == "Failed"
    assert pod_phase("Always", [done_bad]) == "Running"
    assert pod_phase("Always", [running], initialized=False) == "Pending"
    backing_off = ContainerRecord("e", "img", last_terminated={"exitCode": 1})
    assert pod_phase("Always", [backing_off]) == "Running"


def test_container_status_after_a_restart_carries_last_state_and_pid() -> None:
    rec = ContainerRecord(
        "engine", "lmsysorg/sglang:v0.5.23", state=RUNNING, started_at="t2", pid=4242
    )
    rec.restart_count = 1
    rec.ready = True
    rec.started = True
    rec.last_terminated = {
        "exitCode": 137,
        "reason": "Error",
        "startedAt": "t0",
        "finishedAt": "t1",
    }
    status = container_status(rec)
    assert status["state"] == {"running": {"startedAt": "t2"}}
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert (status["restartCount"], status["ready"], status["started"]) == (1, True, True)
    assert container_pid({"status": {"containerStatuses": [status]}}, "engine") == 4242
    assert container_pid({"status": {"containerStatuses": [status]}}, "other") is None


def test_an_empty_dir_at_tmp_is_mounted_after_volumes_whose_source_lives_in_tmp() -> None:
    pairs = [
        ("/tmp/run/pods/p/volumes/tmp", "/tmp"),
        ("/tmp/run/pods/p/volumes/webhook-tls", "/tls"),
        ("/tmp/run/pods/p/volumes/sa", "/var/run/secrets/kubernetes.io/serviceaccount"),
    ]
    ordered = order_mounts(pairs)
    assert ordered[-1] == ("/tmp/run/pods/p/volumes/tmp", "/tmp")
    assert set(ordered) == set(pairs)


def test_a_checkout_under_a_pods_emptydir_mount_stays_visible_to_the_pod() -> None:
    pairs = [("/run/x/volumes/tmp", "/tmp"), ("/run/x/volumes/tls", "/tls")]
    before, after = keep_visible(
        pairs, ["/tmp/clone", "/tmp/clone/.venv", "/srv/other"], stage="/run/keep"
    )
    assert before == [("/tmp/clone", "/run/keep/0")]
    assert after == [("/run/keep/0", "/tmp/clone")]


def test_nothing_is_rebound_when_no_mount_hides_the_checkout() -> None:
    assert keep_visible([("/a", "/tls")], ["/work/main"], stage="/run/keep") == ([], [])


# ---------------------------------------------------------------- native sidecars (KEP-753)
GUARD_SIDECAR = {"name": "kvgate-guard", "restartPolicy": "Always"}


def sidecar_pod(*, gate: bool = True) -> dict[str, Any]:
    return spec("engine", gates=(GATE,) if gate else (), init=[dict(GUARD_SIDECAR)])


def test_an_unready_sidecar_keeps_the_pod_not_ready_even_with_its_gate_true() -> None:
    gate_true = [{"type": GATE, "status": "True"}]
    all_statuses = [
        {"name": "kvgate-guard", "ready": False, "started": True},
        {"name": "engine", "ready": True, "started": True},
    ]
    cond = pod_ready_condition(sidecar_pod(), gate_true, all_statuses, "Running")
    assert cond == Condition(
        "Ready", "False", "ContainersNotReady", "containers with unready status: [kvgate-guard]"
    )
    all_statuses[0]["ready"] = True
    assert pod_ready_condition(sidecar_pod(), gate_true, all_statuses, "Running").status == "True"
    # ... and a ready sidecar never makes up for a gate the operator turned False.
    gate_false = [{"type": GATE, "status": "False"}]
    assert pod_ready_condition(sidecar_pod(), gate_false, all_statuses, "Running").status == "False"


def test_a_sidecar_without_a_status_is_unknown_and_an_unready_engine_is_listed_after_it() -> None:
    cond = containers_ready_condition(
        sidecar_pod(), [{"name": "engine", "ready": False}], "Running"
    )
    assert cond.message == (
        "containers with unknown status: [kvgate-guard], containers with unready status: [engine]"
    )


def test_a_sidecar_initializes_the_pod_once_started_and_a_restart_does_not_uninitialize_it() -> (
    None
):
    pod_spec = spec("engine", init=[{"name": "setup"}, dict(GUARD_SIDECAR)])
    setup_done = {"name": "setup", "ready": True, "state": {"terminated": {"exitCode": 0}}}
    engine_waiting = {"name": "engine", "state": {"waiting": {"reason": "PodInitializing"}}}
    not_started = initialized_condition(
        pod_spec,
        [setup_done, {"name": "kvgate-guard", "started": False, "state": {"running": {}}}],
        "Pending",
    )
    assert not_started.message == "containers with incomplete status: [kvgate-guard]"
    started = initialized_condition(
        pod_spec,
        [setup_done, {"name": "kvgate-guard", "started": True}, engine_waiting],
        "Pending",
    )
    assert started.status == "True"
    # The sidecar crashed and waits to restart; the engine has run: still initialized.
    restarting = initialized_condition(
        pod_spec,
        [
            setup_done,
            {"name": "kvgate-guard", "started": False, "state": {"waiting": {}}},
            {"name": "engine", "state": {"running": {}}},
        ],
        "Running",
    )
    assert restarting == Condition("Initialized", "True")


def test_a_completed_init_container_not_marked_ready_is_incomplete() -> None:
    cond = initialized_condition(
        spec("e", init=[{"name": "setup"}]),
        [{"name": "setup", "ready": False, "state": {"terminated": {"exitCode": 0}}}],
        "Pending",
    )
    assert cond.message == "containers with incomplete status: [setup]"


def test_phase_counts_a_running_sidecar_and_ignores_a_stopped_one() -> None:
    sidecar_running = ContainerRecord("kvgate-guard", "img", state=RUNNING)
    sidecar_stopped = ContainerRecord("kvgate-guard", "img", state=TERMINATED, exit_code=137)
    sidecar_backing_off = ContainerRecord("kvgate-guard", "img", last_terminated={"exitCode": 1})
    engine_done = ContainerRecord("engine", "img", state=TERMINATED, exit_code=0)
    engine_running = ContainerRecord("engine", "img", state=RUNNING)
    assert pod_phase("Never", [engine_done], sidecars=[sidecar_running]) == "Running"
    assert pod_phase("Never", [engine_done], sidecars=[sidecar_stopped]) == "Succeeded"
    assert pod_phase("Always", [engine_running], sidecars=[sidecar_backing_off]) == "Running"
    assert pod_phase("Always", [engine_running], sidecars=[ContainerRecord("s", "i")]) == "Pending"


def test_guard_sidecar_runs_the_kvgate_cli_reading_and_serving_on_the_pod_ip() -> None:
    launch = launch_for(
        "ghcr.io/kvgate/kvgate-operator:0.2.0",
        ["kvgate"],
        ["guard", "--engine-port", "30000", "--role", "decode", "--port", "8471"],
        pod_ip="198.18.1.7",
        python="py",
        venv_bin="/venv/bin",
        gpu_memory_gib=80,
    )
    assert launch.argv == (
        "/venv/bin/kvgate",
        "guard",
        "--engine-port",
        "30000",
        "--role",
        "decode",
        "--port",
        "8471",
        "--engine-host",
        "198.18.1.7",
        "--host",
        "198.18.1.7",
    )


def test_a_kubelet_that_fails_before_registering_fails_its_start(tmp_path: Path) -> None:
    """A kubelet whose run() raised before its nodes registered must not look started: the
    world then waited for pods no kubelet ran and timed out on the operator's rollout (how the
    LeaderWorkerSet world of 3b8965a failed: its hosts file's directory did not exist yet)."""

    class Failing(LoopbackKubelet):
        async def run(self) -> None:
            raise FileNotFoundError("no such directory: kubelet/hosts")

    thread = KubeletThread(
        KubeletConfig(kubeconfig=tmp_path / "kubeconfig", nodes=[], run_dir=tmp_path),
        addresses=None,  # type: ignore[arg-type]  # run() never gets that far
        netns_path=None,
    )
    thread.kubelet = Failing(thread.kubelet.config, None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="failed to start: no such directory"):
        thread.start(timeout=FAILING_START_TIMEOUT)
    thread.stop()


def test_the_checkout_kept_visible_in_pods_is_the_repository_root() -> None:
    """Pods run from this checkout: a clone under /tmp (an emptyDir there would hide it) stays
    visible only if PROJECT_ROOT is the checkout itself, operator/ and engine/ included."""
    assert (PROJECT_ROOT / "pyproject.toml").is_file()
    assert (PROJECT_ROOT / "operator" / "kvgate").is_dir()


def test_an_engine_pod_that_sets_its_load_time_keeps_it() -> None:
    launch = launch_for(
        "lmsysorg/sglang:v0.5.23",
        ["python3", "-m", "sglang.launch_server"],
        ["--model-path", "/m"],
        pod_ip="198.18.1.9",
        python="/venv/bin/python",
        venv_bin="/venv/bin",
        gpu_memory_gib=80,
        env={"KVGATE_REFERENCE_LOAD_SECONDS": "0"},
    )
    assert "KVGATE_REFERENCE_LOAD_SECONDS" not in launch.env  # the pod's own 0 stands
