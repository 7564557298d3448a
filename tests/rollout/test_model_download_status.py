"""A failing model download is said in the ModelDeployment's conditions and one Warning Event,
with the download's own last log line (kvgate.rollout.model_download); before, the status said
only "prefill 0/1 verified" until rollout.verifyTimeoutSeconds refused the revision."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from factories.kmock_world import engine_pod
from kvgate.controller import modeldeployment
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import ApiError
from kvgate.rollout import model_download
from kvgate.rollout.planner import PodState
from kvgate.rollout.status import events_for
from kvgate.verify import pod_view
from test_status import NEW, OLD, compute, conditions, progress, step

FETCH = "kvgate-fetch-model"
LINE = (
    "https://hub.example answered 401 (RepoNotFound) for repository org/model: the token from "
    "Secret hub-token key token is not accepted; put a token that may read it in that Secret"
)


def _fetch(state: dict[str, Any], last: dict[str, Any] | None = None, restarts: int = 0) -> Any:
    status: dict[str, Any] = {"name": FETCH, "restartCount": restarts, "state": state}
    if last is not None:
        status["lastState"] = last
    return status


def _pod(*fetch: dict[str, Any]) -> dict[str, Any]:
    pod = engine_pod(9, role="prefill", ready=False)
    pod["status"]["initContainerStatuses"] = list(fetch)
    return pod


FAILED_NOW = _fetch({"terminated": {"exitCode": 1}})
BACKING_OFF = _fetch(
    {"waiting": {"reason": "CrashLoopBackOff"}}, {"terminated": {"exitCode": 1}}, restarts=3
)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ((), None),  # no download
        ((_fetch({"running": {}}),), None),  # the first attempt runs
        ((_fetch({"terminated": {"exitCode": 0}}, {"terminated": {"exitCode": 1}}, 1),), None),
        ((FAILED_NOW,), model_download.DownloadFailure(1, 0, retrying=False)),
        ((BACKING_OFF,), model_download.DownloadFailure(1, 3, retrying=True)),
        (
            (_fetch({"running": {}}, {"terminated": {"exitCode": 1}}, restarts=2),),
            model_download.DownloadFailure(1, 2, retrying=True),
        ),
        (({"name": "other-init", "state": {"terminated": {"exitCode": 1}}},), None),
    ],
)
def test_a_download_fails_while_its_last_attempt_exited_non_zero(
    statuses: tuple[dict[str, Any], ...], expected: model_download.DownloadFailure | None
) -> None:
    assert model_download.failure_of(_pod(*statuses)) == expected


def test_the_message_names_the_pod_the_exit_the_retries_the_line_and_where_to_read_more() -> None:
    failure = model_download.DownloadFailure(1, 3, retrying=True)
    text = model_download.describe("prefill", "p-1", "models", failure, LINE)
    assert text == (
        "prefill pod p-1: the model download failed (init container kvgate-fetch-model exited "
        "1, restarted 3 times; retrying with the kubelet's back-off): " + LINE + "; the engine "
        "starts once it succeeds (kubectl logs -n models p-1 -c kvgate-fetch-model --previous; "
        "spec.model.source.download)"
    )
    first = model_download.describe(
        "decode", "d", "ns", model_download.DownloadFailure(2, 0, False), None
    )
    assert "exited 2, not restarted yet)" in first and "--previous" not in first


def test_the_operators_copy_of_a_pod_keeps_the_downloads_status_and_no_other_init_container() -> (
    None
):
    pod = _pod(BACKING_OFF, {"name": "other", "state": {"running": {}}, "image": "x"})
    kept = pod_view.slim(pod)
    assert kept["status"]["initContainerStatuses"] == [BACKING_OFF]
    assert model_download.failure_of(kept) == model_download.DownloadFailure(1, 3, True)


async def test_the_failed_attempts_log_is_read_once_and_named_in_the_pods_state(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[tuple[str, dict[str, str]]] = []

    async def get_text(path: str, params: dict[str, str], max_bytes: int) -> str:
        reads.append((path, dict(params)))
        return f"fetching org/model\n{LINE}\n"

    monkeypatch.setattr(rt.api, "get_text", get_text)
    pod = _pod(BACKING_OFF)
    name = pod["metadata"]["name"]
    await modeldeployment.read_download_logs(rt, [pod])
    await modeldeployment.read_download_logs(rt, [pod])  # the same attempt: not read again
    assert reads == [
        (
            f"/api/v1/namespaces/models/pods/{name}/log",
            {"container": FETCH, "tailLines": "5", "previous": "true"},
        )
    ]
    state = modeldeployment.pod_state(rt, pod)
    assert state is not None and state.gate_reason == "ModelDownloadFailing"
    assert state.gate_message is not None and LINE in state.gate_message
    again = copy.deepcopy(pod)
    again["status"]["initContainerStatuses"][0]["restartCount"] = 4  # another failed attempt
    await modeldeployment.read_download_logs(rt, [again])
    assert len(reads) == 2


async def test_an_unreadable_log_still_names_the_failure(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(*_: Any) -> str:
        raise ApiError(403, "GET", "/log", "forbidden")

    monkeypatch.setattr(rt.api, "get_text", refused)
    pod = _pod(FAILED_NOW)
    await modeldeployment.read_download_logs(rt, [pod])
    state = modeldeployment.pod_state(rt, pod)
    assert state is not None and state.gate_reason == "ModelDownloadFailing"
    assert "exited 1, not restarted yet)" in (state.gate_message or "")


def _failing_step(**kw: Any) -> Any:
    message = model_download.describe(
        "prefill",
        "llama-bbbbbbbbbb-prefill-x2",
        "models",
        model_download.DownloadFailure(1, 3, True),
        LINE,
    )
    problem = PodState(
        "llama-bbbbbbbbbb-prefill-x2", NEW, "prefill", False, "ModelDownloadFailing", message
    )
    return step(
        serving_revision=OLD,
        previous_serving_revision=OLD,
        service_revision=OLD,
        progress=progress(pv=0),
        target_problems=(problem,),
        **kw,
    ), message


def test_the_conditions_say_the_download_fails_and_who_keeps_serving() -> None:
    failing, message = _failing_step()
    cond = conditions(compute(failing, previous={"servingRevision": OLD}))
    assert cond["EnginesVerified"]["reason"] == "ModelDownloadFailing"
    assert cond["EnginesVerified"]["message"] == message
    assert message in cond["Progressing"]["message"]
    assert cond["Ready"]["message"].endswith(f"{message}; revision {OLD} keeps serving")


def test_one_warning_event_when_the_download_starts_failing_not_on_every_pass() -> None:
    failing, message = _failing_step()
    first = events_for(failing, {"servingRevision": OLD, "targetRevision": NEW})
    assert [(e.type, e.reason, e.message) for e in first] == [
        ("Warning", "ModelDownloadFailing", message)
    ]
    before = compute(failing, previous={"servingRevision": OLD, "targetRevision": NEW})
    assert events_for(failing, before) == []
