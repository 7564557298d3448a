"""Pure builders: how spec.model.source puts the weights at model.path (plain dicts).

Every source is one pod volume, ``model``, mounted read-only at ``/models`` in the engine
container of every engine pod (single-node pods, multi-node leaders and workers alike):

- ``persistentVolumeClaim``: the claim, read-only (``readOnly`` on the volume and the mount);
- ``hostPath``: the node's directory;
- ``image``: a Kubernetes image volume (``volumes[].image``), read-only by nature;
- ``download``: an emptyDir (or a claim) that the init container ``kvgate-fetch-model`` fills from
  the hub before the engine starts (``kvgate fetch-model``, kvgate.modelfetch), in kvgate's own
  image, with the hub token from the Secret as ``HF_TOKEN``. It writes into model.path under
  the same mount, read-write; the engine only ever reads it.

A spec without a source gets none of this: its pods are built exactly as before.
"""

from __future__ import annotations

from typing import Any

from kvgate.api.models import (
    MODEL_MOUNT_PATH,
    DownloadSource,
    ModelSpec,
    PersistentVolumeClaimSource,
)

Body = dict[str, Any]

MODEL_VOLUME = "model"
FETCH_CONTAINER = "kvgate-fetch-model"
HUB_TOKEN_ENV = "HF_TOKEN"  # what huggingface_hub itself reads; kvgate fetch-model reads it too
# The download streams in 1 MiB chunks with a few files at once and hashes them as they come:
# memory stays small whatever the weights' size. No CPU limit: hashing at network speed needs
# a core, and a throttled download only delays the engine.
FETCH_RESOURCES: Body = {
    "requests": {"cpu": "250m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}


def _claim_volume(claim: PersistentVolumeClaimSource, *, read_only: bool) -> Body:
    volume: Body = {"claimName": claim.claim_name}
    if read_only:
        volume["readOnly"] = True
    return {"name": MODEL_VOLUME, "persistentVolumeClaim": volume}


def model_volume(model: ModelSpec) -> Body | None:
    """The pod volume holding the weights; None without a source."""
    source = model.source
    if source is None:
        return None
    if source.persistent_volume_claim is not None:
        return _claim_volume(source.persistent_volume_claim, read_only=True)
    if source.host_path is not None:
        path = source.host_path
        return {"name": MODEL_VOLUME, "hostPath": {"path": path.path, "type": path.type.value}}
    if source.image is not None:
        image = source.image
        return {
            "name": MODEL_VOLUME,
            "image": {"reference": image.reference, "pullPolicy": image.pull_policy.value},
        }
    download = source.download
    assert download is not None  # ModelSource holds exactly one
    storage = download.storage
    if storage.persistent_volume_claim is not None:
        # Written by the download container, so not readOnly here; the engine's mount is.
        return _claim_volume(storage.persistent_volume_claim, read_only=False)
    empty_dir: Body = {}
    if storage.empty_dir is not None and storage.empty_dir.size_limit is not None:
        empty_dir["sizeLimit"] = storage.empty_dir.size_limit
    return {"name": MODEL_VOLUME, "emptyDir": empty_dir}


def _sub_path(model: ModelSpec) -> str | None:
    source = model.source
    if source is None:
        return None
    claim = source.persistent_volume_claim
    if claim is None and source.download is not None:
        claim = source.download.storage.persistent_volume_claim
    return claim.sub_path if claim is not None else None


def _mount(model: ModelSpec, *, read_only: bool) -> Body:
    mount: Body = {"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH}
    if read_only:
        mount["readOnly"] = True
    sub_path = _sub_path(model)
    if sub_path is not None:
        mount["subPath"] = sub_path
    return mount


def engine_mount(model: ModelSpec) -> Body | None:
    """The engine container's read-only mount of the weights; None without a source."""
    return None if model.source is None else _mount(model, read_only=True)


def fetch_args(download: DownloadSource, model_path: str) -> list[str]:
    """``kvgate fetch-model`` arguments: the repository, revision and endpoint, where to put it,
    and which Secret the token came from (named in errors; the token itself is only in the
    environment)."""
    args = [
        "fetch-model",
        "--repo",
        download.repo,
        "--revision",
        download.revision,
        "--endpoint",
        download.endpoint,
        "--dest",
        model_path,
    ]
    for pattern in download.exclude:
        args.append(f"--exclude={pattern}")
    ref = download.token_secret_ref
    if ref is not None:
        args += ["--token-secret-name", ref.name, "--token-secret-key", ref.key]
    return args


def fetch_container(model: ModelSpec, image: str, security_context: Body) -> Body | None:
    """The init container that downloads the weights before the engine starts (a regular init
    container: the pod's containers start only after it exited 0; a failure is retried with the
    kubelet's back-off, the pod showing Init:Error and the message in its log). None unless the
    source is a download."""
    source = model.source
    download = source.download if source is not None else None
    if download is None:
        return None
    container: Body = {
        "name": FETCH_CONTAINER,
        "image": image,
        "command": ["kvgate"],  # the image's ENTRYPOINT is `kvgate operator`
        "args": fetch_args(download, model.path),
        "volumeMounts": [_mount(model, read_only=False)],
        "resources": {kind: dict(values) for kind, values in FETCH_RESOURCES.items()},
        "securityContext": {**security_context, "readOnlyRootFilesystem": True},
    }
    ref = download.token_secret_ref
    if ref is not None:
        container["env"] = [
            {
                "name": HUB_TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        ]
    return container
